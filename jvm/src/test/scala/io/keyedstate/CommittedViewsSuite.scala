package io.keyedstate

import java.util.concurrent.{CountDownLatch, TimeUnit}

import org.apache.spark.sql.execution.streaming.state._
import org.scalatest.funsuite.AnyFunSuite

import io.keyedstate.conf.KeyedStateConf
import io.keyedstate.rocks.ColumnFamilyCodec

/**
 * The committed views queryable state reads (docs/queryable-state.md): what each holds, how long
 * it is kept, and what happens to reads when a newer version replaces it or the instance goes.
 * Real providers on a real local checkpoint; the store is made queryable as Spark's operator 0
 * (`queryable.operator.0`), which publishes the loaded version at open and each committed one.
 */
class CommittedViewsSuite extends AnyFunSuite with ProviderFixture {
  private val Default = StateStore.DEFAULT_COL_FAMILY_NAME
  private val codec = new ColumnFamilyCodec(StateStoreId.DEFAULT_STORE_NAME, Default, keySchema, valueSchema,
    NoPrefixKeyStateEncoderSpec(keySchema), multipleValues = false, isInternal = false)
  private val queryable = storeConf(KeyedStateConf.QueryablePrefix + "0" -> "q")

  private def partitionOf(p: KeyedStateStoreProvider): StorePartition = {
    val id = p.stateStoreId
    StorePartition(id.checkpointRootLocation, id.operatorId, id.partitionId, id.storeName)
  }

  /** The value of key `k` in version `version` as a lookup reads it, or None when not held. */
  private def lookup(p: KeyedStateStoreProvider, version: Long, k: String): Option[Option[Long]] =
    CommittedViews.read(partitionOf(p), "", version, waitMs = 0) { view =>
      Option(view.get(Default, codec.encodeKey(key(k)))).map(b => codec.decodeValue(b).getLong(0))
    }

  private def commitBatch(p: KeyedStateStoreProvider, version: Long, writes: (String, Long)*): Unit = {
    val store = p.getStore(version)
    writes.foreach { case (k, v) => store.put(key(k), value(v)) }
    store.commit()
  }

  test("each version holds what was committed, the next batch's writes are not seen, the last two are kept") {
    val p = newProvider(tempDir(), queryable)
    try {
      commitBatch(p, 0, "a" -> 1, "b" -> 2)
      commitBatch(p, 1, "a" -> 10)
      val open = p.getStore(2)
      open.put(key("a"), value(100)) // written, not committed
      open.remove(key("b"))
      assert(lookup(p, 2, "a").contains(Some(10L)) && lookup(p, 2, "b").contains(Some(2L)))
      assert(lookup(p, 1, "a").contains(Some(1L)))
      assert(lookup(p, 0, "a").isEmpty, "the version before the last two is released")
      open.commit()
      assert(lookup(p, 3, "a").contains(Some(100L)) && lookup(p, 3, "b").contains(None))
      assert(CommittedViews.versions(partitionOf(p), "") == Seq(2L, 3L))
    } finally p.close()
    assert(CommittedViews.versions(partitionOf(p), "").isEmpty, "an unloaded provider's views are withdrawn")
  }

  test("an aborted batch is never seen: its instance goes with its views, the reload publishes the version it loads") {
    val root = tempDir()
    val p = newProvider(root, queryable)
    try {
      commitBatch(p, 0, "a" -> 1)
      val failed = p.getStore(1)
      failed.put(key("a"), value(2))
      failed.abort()
      assert(lookup(p, 1, "a").isEmpty, "the aborted instance's views are withdrawn with it")
      // The next batch reloads version 1 (the aborted writes dropped it) and serves it before writing.
      val again = p.getStore(1)
      assert(lookup(p, 1, "a").contains(Some(1L)))
      again.put(key("a"), value(3))
      again.commit()
      assert(lookup(p, 2, "a").contains(Some(3L)))
    } finally p.close()
    // Another provider (a restarted query) publishes the version it loads at open.
    val restarted = newProvider(root, queryable)
    try {
      val store = restarted.getStore(2)
      assert(lookup(restarted, 2, "a").contains(Some(3L)))
      store.abort()
    } finally restarted.close()
  }

  test("a version replaced while a lookup reads it: the commit does not wait, the read ends, later reads fail") {
    val p = newProvider(tempDir(), queryable)
    try {
      commitBatch(p, 0, "a" -> 1)
      val inRead = new CountDownLatch(1)
      val finish = new CountDownLatch(1)
      @volatile var seen: Option[Long] = None
      val reader = new Thread(() => CommittedViews.read(partitionOf(p), "", 1, 0) { view =>
        inRead.countDown()
        finish.await(10, TimeUnit.SECONDS)
        seen = Option(view.get(Default, codec.encodeKey(key("a")))).map(b => codec.decodeValue(b).getLong(0))
      })
      reader.start()
      assert(inRead.await(10, TimeUnit.SECONDS))
      // Two commits release version 1 while the read holds it: neither waits for the read.
      val started = System.nanoTime()
      commitBatch(p, 1, "a" -> 2)
      commitBatch(p, 2, "a" -> 3)
      assert((System.nanoTime() - started) / 1000000L < 5000, "a commit waited for a lookup")
      assert(lookup(p, 1, "a").isEmpty)
      finish.countDown()
      reader.join(10000)
      assert(seen.contains(1L), "the read in flight ends on the version it started on")
    } finally p.close()
  }

  test("an instance unloaded under a lookup waits for it, and refuses the lookups after") {
    val p = newProvider(tempDir(), queryable)
    commitBatch(p, 0, "a" -> 1)
    val inRead = new CountDownLatch(1)
    val finish = new CountDownLatch(1)
    @volatile var result: Either[Throwable, Option[Long]] = null
    val reader = new Thread(() => result =
      try Right(CommittedViews.read(partitionOf(p), "", 1, 0) { view =>
        inRead.countDown()
        finish.await(10, TimeUnit.SECONDS)
        Option(view.get(Default, codec.encodeKey(key("a")))).map(b => codec.decodeValue(b).getLong(0))
      }.flatten) catch { case e: Throwable => Left(e) })
    reader.start()
    assert(inRead.await(10, TimeUnit.SECONDS))
    val closer = new Thread(() => p.close())
    closer.start()
    closer.join(300)
    assert(closer.isAlive, "the close did not wait for the lookup in flight")
    finish.countDown()
    reader.join(10000)
    closer.join(10000)
    assert(!closer.isAlive)
    assert(result == Right(Some(1L)), "the lookup in flight reads its version to the end")
    assert(lookup(p, 1, "a").isEmpty)
  }
}
