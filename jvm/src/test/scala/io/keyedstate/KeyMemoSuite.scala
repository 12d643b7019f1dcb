package io.keyedstate

import java.nio.charset.StandardCharsets.UTF_8

import org.scalatest.funsuite.AnyFunSuite

import io.keyedstate.KeyMemo.{Absent, Present, Unknown}

/** The key count's memo answers only what it knows, and stays true when full. */
class KeyMemoSuite extends AnyFunSuite {
  private def b(s: String): Array[Byte] = s.getBytes(UTF_8)

  test("ByteKeyTable: one probe answers and records; keys copied; prefixes looked up by length; grows") {
    val t = new ByteKeyTable
    val reused = b("key-0")
    assert(t.put(reused, 2, mayInsert = true) == ByteKeyTable.Missing)
    reused(0) = 'x'.toByte // the caller's array changes: the table kept a copy
    assert(t.get(b("key-0"), 5) == 2 && t.get(reused, 5) == ByteKeyTable.Missing)
    assert(t.put(b("key-0"), 1, mayInsert = true) == 2 && t.get(b("key-0"), 5) == 1)
    assert(t.put(b("key-0"), 2, mayInsert = true, overwrite = false) == 1 && t.get(b("key-0"), 5) == 1)
    assert(t.put(b("absent"), 1, mayInsert = false) == ByteKeyTable.Missing && t.size == 1)
    assert(t.get(b("key-0-and-more"), 5) == 1 && t.get(b("key-0-and-more"), 4) == ByteKeyTable.Missing)
    (0 until 100000).foreach(i => t.put(b(s"k$i"), (1 + i % 2).toByte, mayInsert = true))
    assert(t.size == 100001)
    assert((0 until 100000).forall(i => t.get(b(s"k$i"), s"k$i".length) == 1 + i % 2))
    assert(t.get(b("k100000"), 7) == ByteKeyTable.Missing && t.get(Array.emptyByteArray, 0) == ByteKeyTable.Missing)
    t.clear()
    assert(t.size == 0 && t.get(b("k1"), 2) == ByteKeyTable.Missing)
  }

  test("a write learns what it makes true and answers what was true before") {
    val m = new KeyMemo(100)
    assert(m.existedBefore("cf", b("a"), existsNow = true) == Unknown) // ask the store
    assert(m.existedBefore("cf", b("a"), existsNow = false) == Present)
    assert(m.existedBefore("cf", b("a"), existsNow = true) == Absent)
    assert(m.existedBefore("other", b("a"), existsNow = true) == Unknown) // per column family
    m.learn("cf", b("r"), exists = false, m.epoch)
    assert(m.existedBefore("cf", b("r"), existsNow = true) == Absent)
    m.forget("cf") // writes to it are no longer known: RocksDB must be asked after the waiting ones
    assert(m.existedBefore("cf", b("a"), existsNow = true) == Unknown)
    m.clear()
    assert(m.existedBefore("other", b("a"), existsNow = true) == Unknown)
  }

  test("a scanned prefix answers for the keys under it, not for itself nor for other prefixes") {
    val m = new KeyMemo(100)
    m.learnScanned("cf", b("p1"), Seq(b("p1-x")), m.epoch)
    assert(m.existedBefore("cf", b("p1-x"), existsNow = true) == Present)
    assert(m.existedBefore("cf", b("p1-y"), existsNow = true) == Absent)
    assert(m.existedBefore("cf", b("p1-y"), existsNow = true) == Present)
    assert(m.existedBefore("cf", b("p1"), existsNow = true) == Unknown)
    assert(m.existedBefore("cf", b("p2-y"), existsNow = true) == Unknown)
    assert(m.existedBefore("cf2", b("p1-y"), existsNow = true) == Unknown)
  }

  test("a scan learns nothing that writes during it made newer, nor after the memo lost track") {
    val m = new KeyMemo(100)
    val start = m.epoch
    m.existedBefore("cf", b("p-a"), existsNow = false) // removed while the scan ran over it
    m.learnScanned("cf", b("p"), Seq(b("p-a"), b("p-b")), start)
    assert(m.existedBefore("cf", b("p-a"), existsNow = true) == Absent)
    assert(m.existedBefore("cf", b("p-b"), existsNow = true) == Present)

    val late = m.epoch
    m.forget("cf") // e.g. a range delete while a scan ran
    m.learnScanned("cf", b("q"), Seq(b("q-a")), late)
    assert(m.existedBefore("cf", b("q-a"), existsNow = true) == Unknown)
    assert(m.existedBefore("cf", b("q-b"), existsNow = true) == Unknown)
  }

  test("a full memo answers Unknown for what it cannot hold, and scans stop vouching for prefixes") {
    val m = new KeyMemo(4)
    m.learnScanned("cf", b("p"), Seq(b("p-a")), m.epoch) // two entries: p-a and the prefix
    assert(m.existedBefore("cf", b("p-b"), existsNow = true) == Absent) // three
    assert(m.existedBefore("cf", b("x"), existsNow = true) == Unknown) // four: full
    // p-c comes to exist unrecorded: the prefix can no longer say absent keys under it are absent.
    assert(m.existedBefore("cf", b("p-c"), existsNow = true) == Absent)
    assert(m.existedBefore("cf", b("p-c"), existsNow = true) == Unknown)
    assert(m.existedBefore("cf", b("p-a"), existsNow = true) == Present) // recorded keys still answer
    m.learnScanned("cf", b("q"), Seq(b("q-a")), m.epoch) // no room for a scan: learns nothing
    assert(m.existedBefore("cf", b("q-b"), existsNow = true) == Unknown) // but full once more
    m.clear()
    m.learnScanned("cf", b("p"), Nil, m.epoch)
    assert(m.existedBefore("cf", b("p-c"), existsNow = true) == Absent)
  }

  test("an empty family answers Absent for unrecorded keys until the memo loses track") {
    val m = new KeyMemo(5) // the empty family takes one entry, as a scanned prefix does
    m.learnEmpty("cf")
    assert(m.existedBefore("cf", b("a"), existsNow = true) == Absent)
    assert(m.existedBefore("cf", b("a"), existsNow = true) == Present) // the write recorded itself
    assert(m.existedBefore("cf", b("b"), existsNow = false) == Absent)
    assert(m.existedBefore("other", b("a"), existsNow = true) == Unknown) // per column family
    m.existedBefore("cf", b("c"), existsNow = true) // five entries (other/a and the family too): full
    // d comes to exist unrecorded: it was absent, but the family can no longer vouch for others.
    assert(m.existedBefore("cf", b("d"), existsNow = true) == Absent)
    assert(m.existedBefore("cf", b("d"), existsNow = true) == Unknown)
    assert(m.existedBefore("cf", b("e"), existsNow = true) == Unknown)
    m.clear() // a commit: what was empty must be learnt again
    assert(m.existedBefore("cf", b("f"), existsNow = true) == Unknown)
    m.learnEmpty("cf")
    m.forget("cf") // a range delete or a drop
    assert(m.existedBefore("cf", b("g"), existsNow = true) == Unknown)
  }

  test("a read's answer does not override what a write recorded since (the read is older)") {
    // The pipelined runner: the lookup thread reads k (absent), the task thread puts k, then the
    // lookup thread records its read. The put must stay recorded, or the next put counts k again.
    val m = new KeyMemo(100)
    assert(m.existedBefore("cf", b("k"), existsNow = true) == Unknown) // the put (the store said absent)
    m.learn("cf", b("k"), exists = false, m.epoch) // the older read's answer arrives
    assert(m.existedBefore("cf", b("k"), existsNow = true) == Present)
    m.learn("cf", b("new"), exists = true, m.epoch) // a key no write touched: learnt as read
    assert(m.existedBefore("cf", b("new"), existsNow = false) == Present)
  }

  test("a lookup thread and an apply thread share one family's memo without losing what either recorded") {
    // Spark's pipelined Python runner reads (the lookup) in its writer thread while the apply
    // node writes in the task thread: both record keys of the same family, as a TTL'd one is.
    val m = new KeyMemo(1000000)
    m.learnEmpty("cf")
    val n = 100000
    val reader = new Thread(() => (0 until n).foreach(i => m.learn("cf", b(s"r-$i"), exists = false, m.epoch)))
    reader.start()
    val firstAnswers = (0 until n).map(i => m.existedBefore("cf", b(s"w-$i"), existsNow = true))
    reader.join()
    assert(firstAnswers.forall(_ == Absent))
    assert((0 until n).forall(i => m.existedBefore("cf", b(s"w-$i"), existsNow = true) == Present))
    assert((0 until n).forall(i => m.existedBefore("cf", b(s"r-$i"), existsNow = true) == Absent))
  }

  test("a read that started before the memo lost track teaches it nothing") {
    // The read found k absent; meanwhile a write made k exist while the memo could not record it
    // (here: the family was forgotten by a range delete after the write). Learning the stale
    // answer would count k's next put as a new key.
    val m = new KeyMemo(100)
    val readStarted = m.epoch
    assert(m.existedBefore("cf", b("k"), existsNow = true) == Unknown) // the put (the store said absent)
    m.forget("cf")
    m.learn("cf", b("k"), exists = false, readStarted) // the stale answer arrives
    assert(m.existedBefore("cf", b("k"), existsNow = true) == Unknown) // the store is asked
    m.learn("cf", b("j"), exists = false, m.epoch) // a read that started after: learnt
    assert(m.existedBefore("cf", b("j"), existsNow = true) == Absent)
  }
}
