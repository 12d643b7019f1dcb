package io.keyedstate.checkpoint.retention

import java.io.File

import org.scalatest.funsuite.AnyFunSuite

import io.keyedstate.checkpoint
import io.keyedstate.conf.KeyedStateConf
import io.keyedstate.ProviderSuiteHelpers

/**
 * Retention through the provider's maintenance: the newest `minBatchesToRetain` versions and the
 * files they need are kept, everything else goes; orphans (a losing attempt's files, a crashed
 * upload's, a dead manifest) go once older than the grace period.
 */
class ProviderRetentionSuite extends AnyFunSuite with ProviderSuiteHelpers {

  for (changelog <- Seq(false, true)) {
    test(s"retention keeps the newest minBatchesToRetain versions and deletes every file they do not need (changelog=$changelog)") {
      val root = tempDir()
      val conf = storeConf("spark.sql.streaming.minBatchesToRetain" -> "3",
        "spark.sql.streaming.stateStore.minDeltasForSnapshot" -> "4",
        KeyedStateConf.Prefix + "changelogCheckpointing" -> changelog.toString,
        KeyedStateConf.Prefix + "orphanFileGracePeriodMs" -> "0")
      val p = newProvider(root, conf)
      (0 until 10).foreach { v =>
        commitWith(p, v.toLong) { s => (0 until 200).foreach(i => s.put(key(s"v$v-$i"), value(i))) }
        p.awaitSnapshotUpload()
      }
      p.doCleanupMaintenance()
      val dir = partitionDir(root)
      val manifests = dir.listFiles().map(_.getName).filter(_.endsWith(".manifest")).sorted
      assert(manifests.toSeq == Seq("10.manifest", "8.manifest", "9.manifest"))
      val store = new checkpoint.CheckpointStore(new org.apache.hadoop.fs.Path(dir.getAbsolutePath),
        new org.apache.hadoop.conf.Configuration())
      val retained = Seq(8L, 9L, 10L).map(v => store.readManifest(v, None))
      if (changelog) {
        // A snapshot every 4 versions: 10 replays at most the changelogs since the last one.
        assert(retained.forall(m => m.snapshotVersion >= 4 && m.changelogs.size <= 5), retained)
      }
      val descriptors = store.listSnapshotDescriptors().map(store.readSnapshotDescriptor)
      assert(descriptors.forall(_.version >= retained.map(_.snapshotVersion).min), descriptors)
      val referenced = (retained.flatMap(_.allFiles) ++ descriptors.flatMap(_.files)).map(_.path).toSet
      val present = store.listDataFiles().map(_._1).toSet
      assert(present == referenced, s"unreferenced: ${present -- referenced}, missing: ${referenced -- present}")

      val fresh = newProvider(root, conf)
      Seq(8L, 9L, 10L).foreach { v =>
        val r = fresh.getReadStore(v)
        assert(contents(r).size == 200 * v)
        r.release()
      }
      val (condition, message) = sparkFailure(fresh.getReadStore(5))
      assert(condition.startsWith("CANNOT_LOAD_STATE_STORE."), condition)
      assert(message.contains("version 5") && message.contains("5.manifest"), message)
      p.close(); fresh.close()
    }
  }

  test("two attempts at one version never corrupt each other; the loser's files are orphans") {
    val root = tempDir()
    val conf = storeConf(KeyedStateConf.Prefix + "orphanFileGracePeriodMs" -> "0")
    val base = newProvider(root, conf)
    commitWith(base, 0)(_.put(key("a"), value(1)))
    val first = newProvider(root, conf)
    val second = newProvider(root, conf)
    val s1 = first.getStore(1)
    val s2 = second.getStore(1)
    s1.put(key("b"), value(2))
    s2.put(key("b"), value(3))
    s1.commit()
    s2.commit() // same version, format v1: the later manifest wins, each lists only its own files
    val reader = newProvider(root, conf)
    val r = reader.getReadStore(2)
    assert(contents(r) == Map(("a", 0) -> 1L, ("b", 0) -> 3L))
    r.release()
    // An orphan of a crashed upload, too old to belong to a commit in flight.
    val junk = new File(partitionDir(root), "shared/000099-deadbeef.sst")
    junk.getParentFile.mkdirs()
    java.nio.file.Files.write(junk.toPath, Array[Byte](1, 2, 3))
    // And a manifest whose writer died before renaming it into place.
    val deadManifest = new File(partitionDir(root), ".3.manifest.0b5e.tmp")
    java.nio.file.Files.write(deadManifest.toPath, Array[Byte](123))
    base.doCleanupMaintenance()
    assert(!junk.exists() && !deadManifest.exists())
    val again = newProvider(root, conf)
    val r2 = again.getReadStore(2)
    assert(contents(r2) == Map(("a", 0) -> 1L, ("b", 0) -> 3L))
    r2.release()
    Seq(base, first, second, reader, again).foreach(_.close())
  }

  test("files younger than the orphan grace period are left alone") {
    val root = tempDir()
    val p = newProvider(root) // default grace: 10 minutes
    commitWith(p, 0)(_.put(key("a"), value(1)))
    val inflight = new File(partitionDir(root), "shared/000077-inflight.sst")
    inflight.getParentFile.mkdirs()
    java.nio.file.Files.write(inflight.toPath, Array[Byte](1))
    p.doCleanupMaintenance()
    assert(inflight.exists())
    p.close()
  }
}
