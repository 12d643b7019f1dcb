package io.keyedstate.conf

import java.io.{File, IOException}

import org.apache.spark.sql.execution.streaming.state.StateStoreId
import org.apache.spark.sql.keyedstate.StateStoreErrorsBridge

/**
 * How the provider's failures surface, in one place: as Spark's own state-store errors (a
 * `SparkException` with Spark's error class and SQLSTATE, so code that catches Spark's errors
 * keeps working), with keyedstate's precise message (the file, the version, what is wrong) as
 * the cause.
 *
 * | failure | Spark error class |
 * |---|---|
 * | a negative version | `CANNOT_LOAD_STATE_STORE.UNEXPECTED_VERSION` |
 * | a version that cannot be loaded (missing or damaged files, a missing version) | `CANNOT_LOAD_STATE_STORE.UNCATEGORIZED` |
 * | a commit that fails | `CANNOT_WRITE_STATE_STORE.CANNOT_COMMIT` |
 *
 * A failure of the executor's local disk (full, read-only, gone) is a [[LocalDiskException]]
 * naming the file, the local directory and the operating system's reason: as the cause of the
 * two above when it happens in a commit or a load, on its own when a write of a task fails.
 */
object KeyedStateErrors {
  def unexpectedVersion(version: Long): Throwable = StateStoreErrorsBridge.unexpectedVersion(version)

  def cannotLoad(id: StateStoreId, version: Long, cause: Throwable): Throwable =
    StateStoreErrorsBridge.cannotLoad(withContext(s"Cannot load version $version of state store $id", cause))

  def cannotCommit(id: StateStoreId, version: Long, cause: Throwable): Throwable =
    StateStoreErrorsBridge.cannotCommit(s"$id version $version",
      withContext(s"Failed to commit version $version of state store $id", cause))

  /**
   * A write to the executor's local disk failed: the working RocksDB instance, the changelog a
   * task records, a file a load downloads. The first line names the file, the operating
   * system's reason ("No space left on device") and the directory to free or move, instead of
   * leaving them to a native stack trace.
   */
  def localDiskWrite(what: String, file: File, cause: Throwable): LocalDiskException = {
    val reason = Option(cause.getMessage).filter(_.nonEmpty).getOrElse(cause.getClass.getName)
    new LocalDiskException(
      s"Cannot write $what $file on the executor's local disk: $reason. keyedstate works under " +
        s"${localDirOf(file)} (${KeyedStateConf.Prefix}localDir, else Spark's local directory): free space " +
        "there or point localDir to a larger disk", cause)
  }

  /** The directory keyedstate was given: the parent of its `keyedstate/` folder. */
  private def localDirOf(file: File): File =
    Iterator.iterate(file.getAbsoluteFile)(_.getParentFile).takeWhile(_ != null)
      .find(f => f.getName == KeyedStateConf.LocalSubdir && f.getParentFile != null)
      .map(_.getParentFile)
      .getOrElse(file.getAbsoluteFile.getParentFile)

  /** Where it happened (store, version) before keyedstate's own message (file, what is wrong). */
  private def withContext(context: String, cause: Throwable): Throwable =
    new CheckpointFileException(s"$context: ${cause.getMessage}", cause)
}

/** A write to the executor's local disk that failed, naming the file, the directory and why. */
class LocalDiskException(message: String, cause: Throwable) extends IOException(message, cause)

/** A store-level failure that names the file and version involved. */
class CheckpointFileException(message: String, cause: Throwable = null)
    extends IOException(message, cause)
