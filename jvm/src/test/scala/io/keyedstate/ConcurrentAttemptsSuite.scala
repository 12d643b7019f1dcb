package io.keyedstate

import java.io.File
import java.util.concurrent.{ConcurrentLinkedQueue, CountDownLatch, CyclicBarrier, TimeUnit}
import java.util.concurrent.atomic.AtomicInteger

import scala.jdk.CollectionConverters._
import scala.util.Try

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.Path
import org.apache.spark.sql.execution.streaming.state._
import org.scalatest.funsuite.AnyFunSuite

import io.keyedstate.conf.KeyedStateConf

/**
 * Two attempts of one task writing the same store version at once, as two executors do under
 * speculation, a task retried while its first attempt still runs, or a zombie executor: two
 * providers (each with its own local directory) load version 1 of one checkpoint, write different
 * content, and commit version 2 concurrently, with checkpoint format v1 (Spark's default: both
 * write `2.manifest`).
 *
 * The checkpoint lives on `lockstep://`, a local file system that holds one chosen thread before
 * its Nth call until the test lets it go. For every N, attempt A is held before its Nth
 * file-system call while attempt B commits entirely, then A finishes: every point of A's commit
 * at which B's whole commit can land. Then, from a new provider (a new executor):
 *   - version 2 holds exactly the content of the attempt whose manifest was written last, never
 *     a mix of the two;
 *   - the other attempt, which lives on with its own history (its manifest was replaced), runs
 *     retention and commits version 3: that version holds exactly its content plus the new write,
 *     and version 2 still loads.
 * In changelog mode, with a snapshot forced on A's commit (uploaded in the background), and in
 * snapshot mode. The lease (`StoreLease`) fences nothing: it only tells `keyedstate rescale` that
 * a query runs; consistency comes from commit-unique file names and whole-manifest replacement.
 */
class ConcurrentAttemptsSuite extends AnyFunSuite with ProviderFixture {

  private val contentA = Map(("b", 0) -> 2L, ("c", 0) -> 20L)
  private val contentB = Map(("a", 0) -> 1L, ("b", 0) -> 3L, ("d", 0) -> 30L)

  private def lockstepConf(): Configuration = TestFileSystems.conf("lockstep", classOf[LockstepFileSystem])

  private def provider(root: File, changelog: Boolean): KeyedStateStoreProvider = {
    val p = new KeyedStateStoreProvider
    val conf = storeConf(
      KeyedStateConf.Prefix + "changelogCheckpointing" -> changelog.toString,
      KeyedStateConf.Prefix + "localDir" -> tempDir().getAbsolutePath,
      // Every orphan is old enough to delete: retention gets every chance to do harm.
      KeyedStateConf.Prefix + "orphanFileGracePeriodMs" -> "0",
      // One transfer thread: a commit's uploads run in the committing thread, where Lockstep holds them.
      KeyedStateConf.Prefix + "transferThreads" -> "1",
      "spark.sql.streaming.stateStore.minDeltasForSnapshot" -> "100")
    p.init(StateStoreId(s"lockstep://${root.getAbsolutePath}", 0, 0), keySchema, valueSchema,
      NoPrefixKeyStateEncoderSpec(keySchema), useColumnFamilies = false, conf, lockstepConf(), false, None)
    p
  }

  /** A new checkpoint whose version 1 holds a = 1, and two providers on it: the two attempts. */
  private def twoAttempts(changelog: Boolean): (File, KeyedStateStoreProvider, KeyedStateStoreProvider) = {
    val root = tempDir()
    val base = provider(root, changelog)
    val s0 = base.getStore(0)
    s0.put(key("a"), value(1))
    s0.commit()
    base.close()
    (root, provider(root, changelog), provider(root, changelog))
  }

  private def load(root: File, changelog: Boolean, version: Long): Map[(String, Int), Long] = {
    val p = provider(root, changelog)
    try { val r = p.getReadStore(version); try contents(r) finally r.release() } finally p.close()
  }

  private def write(s: StateStore, content: Map[(String, Int), Long]): Unit = {
    s.remove(key("a"))
    content.foreach { case ((k, n), v) => s.put(key(k, n), value(v)) }
  }

  /** A thread that runs `f` and keeps its outcome. */
  private final class Attempt(name: String, f: () => Unit) extends Thread(name) {
    @volatile var outcome: Try[Unit] = _
    override def run(): Unit = outcome = Try(f())
  }

  private def foundReplaced(outcome: Try[Unit]): Boolean = outcome.failed.toOption.exists(e =>
    Iterator.iterate(e)(_.getCause).takeWhile(_ != null)
      .exists(c => String.valueOf(c.getMessage).contains("did not replace the existing manifest")))

  private case class Mode(name: String, changelog: Boolean, forceSnapshot: Boolean)
  private val modes = Seq(
    Mode("changelog", changelog = true, forceSnapshot = false),
    Mode("changelog, A snapshots in the background", changelog = true, forceSnapshot = true),
    Mode("snapshot", changelog = false, forceSnapshot = false))

  /**
   * A held before its `holdAt`-th call while B commits; returns whether A reached that call
   * (false: A made fewer calls, it committed wholly before B started).
   */
  private def race(mode: Mode, holdAt: Int): Boolean = {
    val (root, a, b) = twoAttempts(mode.changelog)
    val sA = a.getStore(1, None, mode.forceSnapshot, false)
    val sB = b.getStore(1)
    write(sA, contentA)
    write(sB, contentB)
    val attemptA = new Attempt("attempt-A", () => { sA.commit(); () })
    Lockstep.arm(_ eq attemptA, holdAt)
    val held =
      try {
        attemptA.start()
        val reached = Lockstep.awaitHeldOr(!attemptA.isAlive)
        sB.commit()
        reached
      } finally Lockstep.disarm()
    attemptA.join(TimeUnit.MINUTES.toMillis(2))
    val where = s"${mode.name}: B's commit landed before A's call $holdAt (${Lockstep.heldCall.getOrElse("none")})"
    // Where the file system's rename does not report failure, a commit reads its manifest back:
    // B landing between A's write and that read is found, and A fails instead of living on.
    val aFoundReplaced = foundReplaced(attemptA.outcome)
    assert(attemptA.outcome.isSuccess || aFoundReplaced, s"$where: A failed: ${attemptA.outcome}")
    a.awaitSnapshotUpload()
    b.awaitSnapshotUpload()

    val lastWriter = Lockstep.lastRenameOf("2.manifest")
    val (winner, loser, loserContent, winnerContent) =
      if (lastWriter.contains("attempt-A")) (a, b, contentB, contentA) else (b, a, contentA, contentB)
    assert(load(root, mode.changelog, 2) == winnerContent,
      s"$where: version 2 is not the content of its last manifest's attempt (${lastWriter.getOrElse("?")})")

    // The attempt whose manifest was replaced lives on: cleanup, then its next version.
    loser.doCleanupMaintenance()
    val s2 = loser.getStore(2)
    s2.put(key("z"), value(holdAt))
    s2.commit()
    loser.awaitSnapshotUpload()
    // A failed commit leaves nothing of its own: the attempt's next version starts from the
    // published one.
    val loserBase = if (aFoundReplaced) winnerContent else loserContent
    assert(load(root, mode.changelog, 3) == loserBase + (("z", 0) -> holdAt.toLong),
      s"$where: version 3, built by the attempt whose manifest was replaced, lost or mixed data")
    assert(load(root, mode.changelog, 2) == winnerContent, s"$where: version 2 changed")
    Seq(a, b).foreach(_.close())
    held
  }

  for (mode <- modes) {
    test(s"two attempts commit one version: at every call of one, the other's whole commit (${mode.name})") {
      var n = 1
      while (race(mode, n)) n += 1
      assert(n > 2, s"attempt A made ${n - 1} file-system calls")
      info(s"${n - 1} calls of A's commit, each with B's whole commit before it, and B's after all of them")
    }

    test(s"two attempts commit one version at the same moment (${mode.name})") {
      (1 to 10).foreach { round =>
        val (root, a, b) = twoAttempts(mode.changelog)
        val stores = Seq(a.getStore(1, None, mode.forceSnapshot, false) -> contentA, b.getStore(1) -> contentB)
        stores.foreach { case (s, c) => write(s, c) }
        val start = new CyclicBarrier(2)
        val attempts = stores.map { case (s, _) =>
          new Attempt(s"attempt-$round", () => { start.await(); s.commit(); () })
        }
        attempts.foreach(_.start())
        attempts.foreach(_.join(TimeUnit.MINUTES.toMillis(2)))
        // Each commits, or fails because the other replaced its manifest (read back where the
        // rename does not report failure); at least one commits.
        assert(attempts.forall(a => a.outcome.isSuccess || foundReplaced(a.outcome)), attempts.map(_.outcome))
        assert(attempts.exists(_.outcome.isSuccess), attempts.map(_.outcome))
        Seq(a, b).foreach(_.awaitSnapshotUpload())
        val v2 = load(root, mode.changelog, 2)
        assert(v2 == contentA || v2 == contentB, s"round $round: version 2 mixes the attempts: $v2")
        Seq(a, b).foreach(_.close())
      }
    }
  }

  test("a replaced attempt's background snapshot, finished late, is never the base of the other's version") {
    val (root, a, b) = twoAttempts(changelog = true)
    val sA = a.getStore(1, None, true, false)
    val sB = b.getStore(1)
    write(sA, contentA)
    write(sB, contentB)
    // A's snapshot upload is held at its first call; A's commit returns (it does not wait).
    Lockstep.arm(_.getName.startsWith("keyedstate-snapshot"), 1)
    try {
      sA.commit()
      assert(Lockstep.awaitHeldOr(done = false))
      sB.commit() // replaces 2.manifest while A's snapshot of version 2 is still uploading
    } finally Lockstep.disarm()
    a.awaitSnapshotUpload()
    val descriptors = partitionDir(root).listFiles().map(_.getName).filter(_.endsWith(".snapshot"))
    assert(descriptors.exists(_.startsWith("2_")), descriptors.toSeq) // A's, written after B's manifest
    assert(load(root, changelog = true, 2) == contentB)
    // A lives on: its next version starts from its own snapshot.
    a.doCleanupMaintenance()
    val s2 = a.getStore(2)
    s2.put(key("z"), value(9))
    s2.commit()
    assert(load(root, changelog = true, 3) == contentA + (("z", 0) -> 9L))
    assert(load(root, changelog = true, 2) == contentB)
    Seq(a, b).foreach(_.close())
  }
}

/** Holds the chosen thread before its Nth call of [[LockstepFileSystem]] until released. */
object Lockstep {
  private val calls = new AtomicInteger
  @volatile private var chosen: Thread => Boolean = _ => false
  @volatile private var holdAt = 0
  @volatile private var reached = new CountDownLatch(1)
  @volatile private var release = new CountDownLatch(1)
  @volatile private var held: Option[String] = None
  private val renames = new ConcurrentLinkedQueue[(String, String)]()

  def arm(who: Thread => Boolean, n: Int): Unit = synchronized {
    calls.set(0)
    held = None
    renames.clear()
    reached = new CountDownLatch(1)
    release = new CountDownLatch(1)
    holdAt = n
    chosen = who
  }

  /** Stops holding: the held thread and every later call go on. */
  def disarm(): Unit = synchronized {
    chosen = _ => false
    release.countDown()
  }

  /** Waits until the chosen thread is held (true) or `done` holds (false). */
  def awaitHeldOr(done: => Boolean): Boolean = {
    val deadline = System.nanoTime() + TimeUnit.MINUTES.toNanos(1)
    while (!reached.await(5, TimeUnit.MILLISECONDS)) {
      if (done) return reached.getCount == 0
      if (System.nanoTime() > deadline) throw new AssertionError("the chosen thread neither held nor finished")
    }
    true
  }

  def heldCall: Option[String] = held

  /** The thread that last renamed a file onto `name`. */
  def lastRenameOf(name: String): Option[String] =
    renames.asScala.filter(_._2 == name).lastOption.map(_._1)

  def before(what: String, path: Path): Unit =
    if (chosen(Thread.currentThread()) && calls.incrementAndGet() == holdAt) {
      held = Some(s"$what ${path.getName}")
      val go = release
      reached.countDown()
      go.await(2, TimeUnit.MINUTES)
    }

  def renamed(dst: Path): Unit = renames.add(Thread.currentThread().getName -> dst.getName)
}

/** A local file system on `lockstep://` whose calls go through [[Lockstep]]. */
class LockstepFileSystem extends InterceptedFileSystem("lockstep") {
  override protected def before(what: String, path: Path): Unit = Lockstep.before(what, path)
  override protected def renamed(dst: Path): Unit = Lockstep.renamed(dst)
}
