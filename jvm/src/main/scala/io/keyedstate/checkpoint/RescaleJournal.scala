package io.keyedstate.checkpoint

import java.nio.charset.StandardCharsets.UTF_8

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.{FileContext, Options, Path}
import org.json4s.{DefaultFormats, Formats}
import org.json4s.jackson.Serialization

import io.keyedstate.errors.{ErrorId, KeyedStateErrors}

/**
 * The record of a rescale in progress, at `<checkpoint>/.keyedstate-rescale/journal.json`.
 *
 * While a rescale's output has one, or a checkpoint rescaled in place has one in phase
 * `publishing`, the provider refuses to open its stores (no query runs on half-written state),
 * and `keyedstate rescale` on the same checkpoint finishes or undoes the interrupted run:
 *  - `building`: nothing the query reads was changed yet; undo = drop the staged files;
 *  - `publishing`: the new state is complete; redo = finish moving it in place (idempotent).
 */
final case class RescaleJournal(
    phase: String,
    source: String,
    output: String,
    inPlace: Boolean,
    batchId: Long,
    fromPartitions: Int,
    toPartitions: Int,
    startedAtMs: Long)

object RescaleJournal {
  /** Where a rescale keeps its journal and staging files, under the checkpoint root. */
  val Dir = ".keyedstate-rescale"
  val Building = "building"
  val Publishing = "publishing"

  private implicit val formats: Formats = DefaultFormats

  def path(checkpointRoot: Path): Path = new Path(new Path(checkpointRoot, Dir), "journal.json")

  def read(checkpointRoot: Path, hadoopConf: Configuration): Option[RescaleJournal] = {
    val p = path(checkpointRoot)
    val fs = p.getFileSystem(hadoopConf)
    if (!fs.exists(p)) None
    else {
      val in = fs.open(p)
      val json = try new String(in.readAllBytes(), UTF_8) finally in.close()
      Some(Serialization.read[RescaleJournal](json))
    }
  }

  /** Written to a temporary name and renamed over the old one: there is always a journal. */
  def write(checkpointRoot: Path, journal: RescaleJournal, hadoopConf: Configuration): Unit = {
    val p = path(checkpointRoot)
    val fs = p.getFileSystem(hadoopConf)
    val tmp = new Path(p.getParent, s"journal-${java.util.UUID.randomUUID()}.tmp")
    val out = fs.create(tmp, true)
    try out.write(Serialization.writePretty(journal).getBytes(UTF_8)) finally out.close()
    FileContext.getFileContext(p.toUri, hadoopConf).rename(tmp, p, Options.Rename.OVERWRITE)
  }

  def remove(checkpointRoot: Path, hadoopConf: Configuration): Unit = {
    val p = path(checkpointRoot)
    p.getFileSystem(hadoopConf).delete(p, false)
  }

  /**
   * Called by the provider before it opens a store of the checkpoint. It refuses while the
   * checkpoint is a rescale's unfinished output, or an in-place rescale of it is publishing (or
   * was interrupted while publishing), naming the journal and what to do. An in-place rescale
   * that has not published yet changed nothing the query reads: the query may run (the rescale
   * then fails, seeing the logs move, and a re-run undoes it).
   */
  def checkNoRescaleInProgress(checkpointRoot: Path, hadoopConf: Configuration): Unit =
    read(checkpointRoot, hadoopConf).filterNot(j => j.inPlace && j.phase == Building).foreach { j =>
      throw KeyedStateErrors.badState(ErrorId.RescaleInProgress,
        s"The checkpoint $checkpointRoot is being rescaled from ${j.fromPartitions} to ${j.toPartitions} " +
          s"partitions (journal ${path(checkpointRoot)}, phase '${j.phase}', started at " +
          s"${java.time.Instant.ofEpochMilli(j.startedAtMs)}). Wait for `keyedstate rescale` to finish; if it " +
          "was interrupted, run it again with the same arguments to complete it.")
    }
}
