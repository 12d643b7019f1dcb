package io.keyedstate

import java.io.{File, RandomAccessFile}

import org.apache.spark.sql.execution.streaming.state._
import org.scalatest.funsuite.AnyFunSuite

import io.keyedstate.conf.KeyedStateConf
import io.keyedstate.errors.{CheckpointFileException, ErrorId, KeyedStateError, KeyedStateErrors}

/**
 * What the provider's failures surface as: Spark's `CANNOT_LOAD_STATE_STORE.*` and
 * `CANNOT_WRITE_STATE_STORE.*` conditions as its RocksDB provider raises them, keyedstate's
 * message (file, version, what is wrong) as the cause: damaged state files, changelogs and
 * manifests, a missing version, a busy partition, a rename that reports failure; and an invalid
 * option.
 */
class StoreErrorsSuite extends AnyFunSuite with ProviderSuiteHelpers {

  private def committedSst(root: File, version: Long): File = {
    val store = new checkpoint.CheckpointStore(
      new org.apache.hadoop.fs.Path(partitionDir(root).getAbsolutePath), new org.apache.hadoop.conf.Configuration())
    val entry = store.readManifest(version, None).files.find(_.localName.endsWith(".sst")).get
    new File(partitionDir(root), entry.path)
  }

  private def oneVersion(conf: StateStoreConf = snapshotMode): File = {
    val root = tempDir()
    val p = newProvider(root, conf)
    commitWith(p, 0) { s => (0 until 100).foreach(i => s.put(key(s"k$i"), value(i))) }
    p.close()
    root
  }

  /** Loads on a new executor (its own local directory, so nothing comes from a local cache). */
  private def assertLoadFails(root: File, version: Long, mustMention: String*): Unit =
    assertLoadFailsWith(root, version, Map.empty, "", mustMention: _*)

  /** A load that fails with Spark's `CANNOT_LOAD_STATE_STORE.<subCondition>`. */
  private def assertLoadFailsAs(subCondition: String, root: File, version: Long, mustMention: String*): Unit =
    assertLoadFailsWith(root, version, Map.empty, subCondition, mustMention: _*)

  private def assertLoadFailsWith(root: File, version: Long, settings: Map[String, String], subCondition: String,
      mustMention: String*): Unit = {
    val p = newProvider(root, storeConf((Seq(KeyedStateConf.Prefix + "changelogCheckpointing" -> "false",
      KeyedStateConf.Prefix + "localDir" -> tempDir().getAbsolutePath) ++ settings): _*))
    val (condition, message) = sparkFailure(p.getStore(version))
    assert(condition.startsWith("CANNOT_LOAD_STATE_STORE." + subCondition), condition)
    mustMention.foreach(m => assert(message.contains(m), s"'$message' should mention '$m'"))
    p.close()
  }

  test("a truncated state file fails the load, naming the file and the version") {
    val root = oneVersion()
    val sst = committedSst(root, 1)
    val raf = new RandomAccessFile(sst, "rw")
    try raf.setLength(sst.length() / 2) finally raf.close()
    new File(sst.getParentFile, s".${sst.getName}.crc").delete()
    assertLoadFailsAs("UNEXPECTED_FILE_SIZE", root, 1, sst.getName, "version 1", "damaged")
  }

  test("a deleted state file fails the load, naming the file and the version") {
    val root = oneVersion()
    val sst = committedSst(root, 1)
    assert(sst.delete())
    // Spark's condition as its RocksDB provider raises it, naming the file.
    assertLoadFailsAs("CANNOT_READ_STREAMING_STATE_FILE", root, 1, sst.getName, "version 1", "missing")
  }

  test("a state file with flipped bytes fails the checksum, naming the file and the version") {
    val root = oneVersion()
    val sst = committedSst(root, 1)
    val raf = new RandomAccessFile(sst, "rw")
    try { raf.seek(10); val b = raf.read(); raf.seek(10); raf.write(b ^ 0xff) } finally raf.close()
    // Hadoop's local checksum side file catches it first ...
    assertLoadFails(root, 1, sst.getName, "version 1", "corrupt")
    // ... and on a file system without one, the manifest's CRC32C does.
    new File(sst.getParentFile, s".${sst.getName}.crc").delete()
    assertLoadFails(root, 1, sst.getName, "version 1", "CRC32C")
  }

  test("a truncated or corrupt changelog fails the load, naming it and the version") {
    val root = oneVersion(storeConf())
    val log = new File(partitionDir(root), "changelog").listFiles().filter(_.getName.endsWith(".changelog")).head
    val crc = new File(log.getParentFile, s".${log.getName}.crc")
    val raf = new RandomAccessFile(log, "rw")
    try raf.setLength(log.length() - 7) finally raf.close()
    crc.delete()
    assertLoadFails(root, 1, log.getName, "version 1", "damaged")
    // The same bytes count but different content: the CRC32C in the manifest catches it.
    val other = oneVersion(storeConf())
    val log2 = new File(partitionDir(other), "changelog").listFiles().filter(_.getName.endsWith(".changelog")).head
    val raf2 = new RandomAccessFile(log2, "rw")
    try { raf2.seek(20); val b = raf2.read(); raf2.seek(20); raf2.write(b ^ 0x5a) } finally raf2.close()
    new File(log2.getParentFile, s".${log2.getName}.crc").delete()
    assertLoadFails(other, 1, log2.getName, "version 1", "CRC32C")
  }

  private def onlyChangelog(root: File): File =
    new File(partitionDir(root), "changelog").listFiles().filter(_.getName.endsWith(".changelog")).head

  test("a damaged compressed changelog fails the load naming it and the version, even with checksums off") {
    for (codec <- Seq("lz4", "zstd")) {
      val root = oneVersion(storeConf(KeyedStateConf.Prefix + "changelogCompression" -> codec))
      val log = onlyChangelog(root)
      val raf = new RandomAccessFile(log, "rw")
      try { val at = log.length() / 2; raf.seek(at); val b = raf.read(); raf.seek(at); raf.write(b ^ 0x5a) }
      finally raf.close()
      new File(log.getParentFile, s".${log.getName}.crc").delete()
      // The size is right and the manifest's CRC32C is not checked: the codec's own check catches it.
      assertLoadFailsWith(root, 1, Map(KeyedStateConf.Prefix + "verifyChecksumsOnLoad" -> "false"), "",
        log.getName, "version 1", "damaged")
    }
  }

  test("a truncated or missing manifest fails the load, naming it and the version") {
    val root = oneVersion()
    val manifest = new File(partitionDir(root), "1.manifest")
    val raf = new RandomAccessFile(manifest, "rw")
    try raf.setLength(40) finally raf.close()
    new File(manifest.getParentFile, ".1.manifest.crc").delete()
    assertLoadFails(root, 1, "1.manifest", "version 1", "corrupt")
    assert(manifest.delete())
    assertLoadFails(root, 1, "1.manifest", "version 1", "missing")
  }

  test("load failures are Spark's CANNOT_LOAD_STATE_STORE errors, keyedstate's message (path, version) the cause") {
    val root = tempDir()
    val p = newProvider(root)
    commitWith(p, 0)(_.put(key("a"), value(1)))
    val negative = intercept[Exception](p.getStore(-1))
    assert(condition(negative) == "CANNOT_LOAD_STATE_STORE.UNEXPECTED_VERSION", negative)
    val missingVersion = intercept[Exception](p.getReadStore(7))
    // Spark's condition for a missing state file, `fileToRead` the manifest.
    assert(condition(missingVersion) == "CANNOT_LOAD_STATE_STORE.CANNOT_READ_STREAMING_STATE_FILE", missingVersion)
    assert(missingVersion.getMessage.contains("7.manifest"), missingVersion.getMessage)
    val (_, message) = sparkFailure(p.getReadStore(7))
    assert(message.contains("version 7") && message.contains("7.manifest") && message.contains(root.getAbsolutePath),
      message)
    // The provider still serves the versions it has.
    val r = p.getReadStore(1)
    assert(contents(r) == Map(("a", 0) -> 1L))
    r.release(); p.close()
  }

  test("a partition held by another task past the wait is Spark's UNRELEASED_THREAD_ERROR, keyedstate's STORE_BUSY the cause") {
    // The two-minute wait itself is not run here: the mapping of its failure is.
    val busy = KeyedStateErrors.storeBusy("Timed out after 2 minutes waiting for state store s", "task-7", 120000)
    val e = KeyedStateErrors.cannotLoad(StateStoreId("/cp", 0, 3), 5, busy)
    assert(condition(e) == "CANNOT_LOAD_STATE_STORE.UNRELEASED_THREAD_ERROR", e)
    assert(e.getMessage.contains("task-7") && e.getMessage.contains("120000"), e.getMessage)
    val ours = KeyedStateError.find(e).get
    assert(ours.error == ErrorId.StoreBusy && !ours.isInstanceOf[CheckpointFileException], ours)
    assert(ours.getMessage.startsWith("[KEYEDSTATE_STORE_BUSY] Cannot load version 5 of state store"), ours.getMessage)
  }

  test("a file system whose rename reports failure fails the commit with CANNOT_WRITE_STATE_STORE.CANNOT_COMMIT") {
    val dir = tempDir()
    val hadoopConf = TestFileSystems.conf("renamefails", classOf[RenameReturnsFalseFileSystem])
    val p = new KeyedStateStoreProvider
    p.init(StateStoreId(s"renamefails://${dir.getAbsolutePath}", 0, 0), keySchema, valueSchema,
      NoPrefixKeyStateEncoderSpec(keySchema), useColumnFamilies = false, storeConf(), hadoopConf, false, None)
    val s = p.getStore(0)
    s.put(key("a"), value(1))
    val (condition, message) = sparkFailure(s.commit())
    assert(condition == "CANNOT_WRITE_STATE_STORE.CANNOT_COMMIT", condition)
    assert(message.contains("version 1") && message.contains("manifest"), message)
    assert(!new File(partitionDir(dir), "1.manifest").exists())
    p.close()
  }

  test("an invalid option names the key, the value and what is allowed") {
    val bad = intercept[IllegalArgumentException] {
      newProvider(tempDir(), storeConf(KeyedStateConf.Prefix + "compression" -> "brotli"))
    }
    assert(bad.getMessage.contains("spark.sql.streaming.stateStore.keyedstate.compression"))
    assert(bad.getMessage.contains("brotli") && bad.getMessage.contains("zstd"))
    val neg = intercept[IllegalArgumentException] {
      newProvider(tempDir(), storeConf(KeyedStateConf.Prefix + "transferThreads" -> "0"))
    }
    assert(neg.getMessage.contains("transferThreads") && neg.getMessage.contains("'0'") &&
      neg.getMessage.contains("from 1 to 256"))
    val unknown = intercept[IllegalArgumentException] {
      newProvider(tempDir(), storeConf(KeyedStateConf.Prefix + "blockCacheSize" -> "5"))
    }
    assert(unknown.getMessage.contains("blockCacheSize") && unknown.getMessage.contains("blockCacheSizeMB"))
  }
}

/** A local file system whose rename reports failure, as Spark's own test file system does. */
class RenameReturnsFalseFileSystem extends org.apache.hadoop.fs.RawLocalFileSystem {
  override def getUri: java.net.URI = java.net.URI.create("renamefails:///")
  override def rename(src: org.apache.hadoop.fs.Path, dst: org.apache.hadoop.fs.Path): Boolean = false
}
