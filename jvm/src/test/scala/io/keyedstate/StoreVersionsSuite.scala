package io.keyedstate

import java.io.File

import org.apache.spark.sql.execution.streaming.state._
import org.scalatest.funsuite.AnyFunSuite

import io.keyedstate.conf.KeyedStateConf

/**
 * Versions on a real local Hadoop file system: durable and loaded by a fresh provider (a new
 * executor) or from the local cache (a restart), by commit id (checkpoint format v2), from
 * nothing (`loadEmpty`), each carrying the operator's declaration.
 */
class StoreVersionsSuite extends AnyFunSuite with ProviderSuiteHelpers {

  test("versions are durable and any retained version loads in a fresh provider (new executor)") {
    val root = tempDir()
    val a = newProvider(root)
    assert(commitWith(a, 0) { s => s.put(key("a"), value(1)); s.put(key("b"), value(2)) } == 1)
    assert(commitWith(a, 1) { s => s.put(key("c"), value(3)); s.remove(key("a")) } == 2)
    assert(commitWith(a, 2) { s => s.put(key("b"), value(20)) } == 3)
    a.close()

    // Another executor: another local directory, everything comes from the checkpoint.
    val b = newProvider(root, storeConf(KeyedStateConf.Prefix + "localDir" -> tempDir().getAbsolutePath))
    def at(v: Long) = { val s = b.getReadStore(v); try contents(s) finally s.release() }
    assert(at(1) == Map(("a", 0) -> 1L, ("b", 0) -> 2L))
    assert(at(2) == Map(("b", 0) -> 2L, ("c", 0) -> 3L))
    assert(at(3) == Map(("b", 0) -> 20L, ("c", 0) -> 3L))
    val s = b.getStore(3)
    assert(s.get(key("b")).getLong(0) == 20L)
    assert(s.get(key("a")) == null)
    assert(s.keyExists(key("c")) && !s.keyExists(key("a")))
    assert(s.metrics.numKeys == 2)
    s.abort()
    b.close()
  }

  test("a restart on the same executor links files from the local cache; a new executor downloads") {
    val root = tempDir()
    val local = tempDir().getAbsolutePath
    val conf = storeConf("spark.sql.streaming.stateStore.minDeltasForSnapshot" -> "2",
      KeyedStateConf.Prefix + "localDir" -> local)
    val a = newProvider(root, conf)
    (0 until 4).foreach { v =>
      commitWith(a, v.toLong) { s => (0 until 500).foreach(i => s.put(key(s"v$v-$i"), value(i))) }
      a.awaitSnapshotUpload()
    }
    a.close()
    def loadMetrics(p: KeyedStateStoreProvider): Map[String, Long] = {
      val s = p.getStore(4)
      assert(contents(s).size == 2000)
      val m = s.metrics.customMetrics.map { case (k, v) => k.name -> v }
      s.abort()
      p.close()
      m
    }
    val sameExecutor = loadMetrics(newProvider(root, conf))
    assert(sameExecutor("keyedstateLoadBytesDownloaded") == 0, sameExecutor)
    assert(sameExecutor("keyedstateLoadFilesReusedLocally") > 0, sameExecutor)
    val newExecutor = loadMetrics(newProvider(root,
      storeConf(KeyedStateConf.Prefix + "localDir" -> tempDir().getAbsolutePath)))
    assert(newExecutor("keyedstateLoadBytesDownloaded") > 0, newExecutor)
    assert(newExecutor("keyedstateLoadFilesReusedLocally") == 0, newExecutor)
  }

  test("an operator's declaration is committed with its version, carried on, and dropped by an abort") {
    import org.json4s._
    val root = tempDir()
    val p = newProvider(root)
    def declared(s: StateStore) = s.asInstanceOf[TaskStateStore].declaration
    def declare(s: StateStore, d: JValue): Unit = s.asInstanceOf[TaskStateStore].declare(d)
    val first = JObject("kind" -> JString("test"), "n" -> JInt(1))
    val second = JObject("kind" -> JString("test"), "n" -> JInt(2))
    commitWith(p, 0) { s => assert(declared(s).isEmpty); declare(s, first); s.put(key("a"), value(1)) }
    commitWith(p, 1)(_.put(key("b"), value(2))) // not declared again: carried on
    val aborted = p.getStore(2)
    declare(aborted, second)
    assert(declared(aborted).contains(second))
    aborted.abort()
    // The aborted declaration went with the instance: the version is reloaded as committed.
    val again = p.getStore(2)
    assert(declared(again).contains(first), declared(again))
    assert(again.asInstanceOf[TaskStateStore].loadedManifest.getName == "2.manifest")
    again.abort()
    val fresh = newProvider(root)
    Seq(1L, 2L).foreach { v =>
      val r = fresh.getReadStore(v)
      assert(r.asInstanceOf[TaskStateStore].declaration.contains(first), v)
      r.release()
    }
    val manifest = new File(root, "0/0/2.manifest")
    assert(manifest.exists())
    assert(io.keyedstate.checkpoint.VersionManifest.fromJson(
      new String(java.nio.file.Files.readAllBytes(manifest.toPath))).declaration.contains(first))
    val readOnly = fresh.getReadStore(2)
    intercept[IllegalStateException](readOnly.asInstanceOf[TaskStateStore].declare(second))
    readOnly.release()
    p.close(); fresh.close()
  }

  test("checkpoint format v2: each commit has an id, and loads pick the commit by id") {
    val root = tempDir()
    val conf = storeConf("spark.sql.streaming.stateStore.checkpointFormatVersion" -> "2")
    val p = newProvider(root, conf)
    val s0 = p.getStore(0)
    s0.put(key("a"), value(1))
    s0.commit()
    val info1 = s0.getStateStoreCheckpointInfo()
    assert(info1.batchVersion == 1 && info1.stateStoreCkptId.isDefined && info1.baseStateStoreCkptId.isEmpty)
    val attempts = (1 to 2).map { n =>
      val q = newProvider(root, conf)
      val s = q.getStore(1, info1.stateStoreCkptId)
      s.put(key("b"), value(n))
      s.commit()
      val info = s.getStateStoreCheckpointInfo()
      assert(info.baseStateStoreCkptId == info1.stateStoreCkptId)
      q.close()
      n -> info.stateStoreCkptId
    }
    attempts.foreach { case (n, id) =>
      val q = newProvider(root, conf)
      val r = q.getReadStore(2, id)
      assert(contents(r) == Map(("a", 0) -> 1L, ("b", 0) -> n.toLong))
      r.release(); q.close()
    }
    val q = newProvider(root, conf)
    assert(sparkFailure(q.getStore(2))._2.contains("2 commits"))
    q.close(); p.close()
  }

  test("loadEmpty starts a version from nothing") {
    val root = tempDir()
    val p = newProvider(root)
    commitWith(p, 0)(_.put(key("a"), value(1)))
    val s = p.getStore(7, None, forceSnapshotOnCommit = false, loadEmpty = true)
    assert(contents(s).isEmpty)
    s.put(key("z"), value(26))
    assert(s.commit() == 8)
    val q = newProvider(root)
    val r = q.getReadStore(8)
    assert(contents(r) == Map(("z", 0) -> 26L))
    r.release(); p.close(); q.close()
  }
}
