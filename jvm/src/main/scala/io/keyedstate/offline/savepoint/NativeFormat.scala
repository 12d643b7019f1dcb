package io.keyedstate.offline.savepoint

import java.util.concurrent.atomic.AtomicInteger

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.Path
import org.apache.spark.sql.SparkSession

import io.keyedstate.checkpoint.{CheckpointStore, Transfers}
import io.keyedstate.conf.KeyedStateConf
import io.keyedstate.errors.{ErrorId, KeyedStateErrors}
import io.keyedstate.offline.{CheckpointWriter, OfflineJob, QueryCheckpoint, SavepointFile, SavepointMetadata,
  SavepointOperator, StoreRef}
import io.keyedstate.offline.rescale.Rescaler

/** One store partition's committed version, copied with its manifest from one root to another. */
final case class StoreCopy(store: StoreRef, sourceDir: String, targetDir: String, version: Long,
    checkpointId: Option[String], verify: Boolean)

/** What a copy wrote: the files (relative to the target root) and the function its manifest declares. */
final case class CopiedStore(store: StoreRef, files: Seq[SavepointFile], function: String, uid: String)

/**
 * The native format: every store partition's committed version as keyedstate's provider keeps
 * it (its manifest and the files it lists, copied and checked against their CRC32C), laid out
 * as in a checkpoint. A restore is a copy, or at another partition count a rescale of the
 * savepoint; it restores into keyedstate's provider only.
 */
final class NativeFormat(spark: SparkSession, hadoopConf: Configuration, conf: KeyedStateConf,
    progress: String => Unit) extends SavepointFormat {
  import NativeFormat._

  def name: String = SavepointMetadata.Native

  def check(src: QueryCheckpoint, batch: Long): Unit = {
    src.requireKeyedStateProvider(batch, "native savepoint")
  }

  def write(src: QueryCheckpoint, dst: QueryCheckpoint, batch: Long, partitions: Int,
      usesCheckpointIds: Boolean, gaps: BatchGaps): (Seq[SavepointOperator], Seq[SavepointFile]) = {
    val stores = for (op <- src.operators; store <- src.storeNames(op, 0)) yield op -> store
    // On the driver, each file in a gap between the query's batches: no Spark job, whose tasks
    // would take the running query's task slots. A savepoint links files and writes manifests on a
    // local disk; elsewhere it streams the files, `transferThreads` store partitions at a time.
    val tasks = copyTasks(src, dst, stores, batch, partitions, usesCheckpointIds, verify = false)
    // A pool of the savepoint's own: its copies wait in the query's batches, and the JVM's transfer
    // pool serves the query's commits (in local mode, this JVM's).
    val pool = Transfers.daemonPool("keyedstate-savepoint-copy", math.max(1, math.min(conf.transferThreads, tasks.size)))
    val done = new AtomicInteger()
    val copied = try Transfers.parallelOn(pool, tasks) { t =>
      val copy = copyStore(t, hadoopConf, beforeEachFile = () => gaps.await())
      val n = done.incrementAndGet()
      if (n % ProgressEvery == 0 || n == tasks.size) progress(s"copy: $n/${tasks.size} store partitions done")
      copy
    } finally pool.shutdown()
    val operators = stores.groupBy(_._1).toSeq.sortBy(_._1).map { case (op, s) =>
      val first = copied.find(c => c.store.operatorId == op && c.store.partition == 0)
      SavepointOperator(op, src.operatorName(op), s.map(_._2), first.map(_.function).getOrElse(""),
        first.map(_.uid).getOrElse(""))
    }
    (operators, copied.flatMap(_.files))
  }

  def restore(sp: QueryCheckpoint, metadata: SavepointMetadata, dst: QueryCheckpoint, partitions: Int,
      provider: Option[String]): Long = {
    provider.filter(_ != QueryCheckpoint.OurProvider).foreach { p =>
      throw KeyedStateErrors.badArgument(ErrorId.QueryCheckpointInvalid, s"a native savepoint holds " +
        s"${QueryCheckpoint.OurProvider}'s files and restores into it only, not $p; take a canonical savepoint " +
        "to move the state to another provider")
    }
    if (partitions != metadata.partitions) {
      new Rescaler(spark, progress).run(sp.root.toString, partitions, Some(dst.root.toString), inPlace = false,
        restoring = true)
        .bytesWritten
    } else {
      val stores = for (op <- metadata.operators; store <- op.stores) yield op.operatorId -> store
      // A restore checks every file's CRC32C: a Spark job, spread over the executors.
      val tasks = copyTasks(sp, dst, stores, metadata.batchId, metadata.partitions, usesIds = false, verify = true)
      val copied = OfflineJob.run(spark, "restore", "copy", tasks, OfflineJob.hadoopSettings(hadoopConf), conf,
        progress)((t: StoreCopy, h, _) => copyStore(t, OfflineJob.hadoopConf(h)))
      val stateFiles = copied.flatMap(_.files).map(_.path).toSet
      val logs = metadata.files.filterNot(f => stateFiles(f.path)).map(f => Savepoints.copyFile(sp, dst, f.path))
      // Spark's operator metadata names schema files by absolute path: the new checkpoint's own.
      dst.operators.flatMap(dst.operatorMetadataFiles).foreach { relative =>
        dst.writeFile(new Path(dst.root, relative), CheckpointWriter.pinnedText(dst, relative, partitions))
      }
      (copied.flatMap(_.files) ++ logs).iterator.map(_.size).sum
    }
  }

  /**
   * The copies of every store partition's version `batch + 1` from `from` to `to`; under format v2 by
   * the checkpoint ids the commit of `batch` records (read once per operator). The copy is saved
   * under the version's name alone (`<version>.manifest`), as the savepoint's commits keep no ids:
   * a savepoint, and every checkpoint restored from it, is independent of the source's format.
   */
  private def copyTasks(from: QueryCheckpoint, to: QueryCheckpoint, stores: Seq[(Int, String)], batch: Long,
      partitions: Int, usesIds: Boolean, verify: Boolean): Seq[StoreCopy] =
    stores.flatMap { case (op, store) =>
      val ids = if (usesIds) from.defaultStoreCheckpointIds(batch, op, 0 until partitions) else Map.empty[Int, String]
      (0 until partitions).map { p =>
        val ref = StoreRef(op, store, p)
        StoreCopy(ref, from.storeDir(ref).toString, to.storeDir(ref).toString, batch + 1, ids.get(p),
          verify)
      }
    }
}

object NativeFormat {
  /** A savepoint's copy reports its progress every this many store partitions. */
  private val ProgressEvery = 16

  /**
   * Copies one store partition's version and its manifest, each file checked (driver or executor
   * side), calling `beforeEachFile` first (a savepoint's yield to the running query).
   */
  def copyStore(task: StoreCopy, hadoopConf: Configuration, beforeEachFile: () => Unit = () => ()): CopiedStore = {
    beforeEachFile()
    val source = new CheckpointStore(new Path(task.sourceDir), hadoopConf)
    val target = new CheckpointStore(new Path(task.targetDir), hadoopConf)
    val manifest = source.readManifest(task.version, task.checkpointId)
    target.ensureRoot()
    // A savepoint links the checkpoint's files (checked by size), a restore links or copies
    // the savepoint's (checked by CRC32C): a damaged file is found before a query loads it.
    manifest.allFiles.foreach { f =>
      beforeEachFile()
      source.linkOrCopyTo(f, task.version, target, verify = task.verify)
    }
    beforeEachFile()
    target.writeManifest(manifest, checkpointIdsEnabled = false)
    val manifestPath = target.manifestPath(task.version, None)
    val dir = task.store.describe // state/<op>/<partition>[/<store>], relative to the root
    val (size, crc) = Savepoints.checksum(manifestPath.getFileSystem(hadoopConf), manifestPath, s"manifest $manifestPath")
    val files = manifest.allFiles.map(f => SavepointFile(s"$dir/${f.path}", f.size, f.crc32c)) :+
      SavepointFile(s"$dir/${manifestPath.getName}", size, crc)
    CopiedStore(task.store, files, manifest.declaredFunction.getOrElse(""), manifest.declaredUid.getOrElse(""))
  }
}
