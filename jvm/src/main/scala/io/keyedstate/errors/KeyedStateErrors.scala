package io.keyedstate.errors

import java.io.File

import org.apache.hadoop.fs.Path
import org.apache.spark.sql.execution.streaming.state.{StateStore, StateStoreId}
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
 * | a version whose manifest or state file is missing | `CANNOT_LOAD_STATE_STORE.CANNOT_READ_STREAMING_STATE_FILE` (`fileToRead`) |
 * | a state file whose download has another size than its manifest says | `CANNOT_LOAD_STATE_STORE.UNEXPECTED_FILE_SIZE` |
 * | a partition another task of the executor holds for two minutes | `CANNOT_LOAD_STATE_STORE.UNRELEASED_THREAD_ERROR` |
 * | a version that cannot be loaded for another reason (a damaged file, RocksDB refused to open) | `CANNOT_LOAD_STATE_STORE.UNCATEGORIZED` |
 * | a commit that fails | `CANNOT_WRITE_STATE_STORE.CANNOT_COMMIT` |
 * | a call on a column family the store does not have | `STATE_STORE_UNSUPPORTED_OPERATION_ON_MISSING_COLUMN_FAMILY` |
 * | creating or removing a column family named empty, with edge spaces, or `default` | `STATE_STORE_CANNOT_USE_COLUMN_FAMILY_WITH_INVALID_NAME` |
 * | creating a column family starting with `_` (not internal) | `STATE_STORE_CANNOT_CREATE_COLUMN_FAMILY_WITH_RESERVED_CHARS` |
 * | a call the store or the column family's encoder does not support | `STATE_STORE_UNSUPPORTED_OPERATION` |
 *
 * A failure of the executor's local disk (full, read-only, gone) is a [[LocalDiskException]]
 * naming the file, the local directory and the operating system's reason: as the cause of the
 * two above when it happens in a commit or a load, on its own when a write of a task fails.
 *
 * Every error keyedstate raises itself is built here and carries a stable identifier
 * ([[io.keyedstate.errors.ErrorId]], `[ID]` at the start of its message); where Spark's class
 * is the outer error, keyedstate's is its cause. Each keeps the Java type callers catch
 * (`IllegalArgumentException` for a bad option, `IOException` for a file).
 */
object KeyedStateErrors {
  def unexpectedVersion(version: Long): Throwable = StateStoreErrorsBridge.unexpectedVersion(version)

  /** Spark's most precise `CANNOT_LOAD_STATE_STORE` condition for `cause`, keyedstate's error its cause. */
  def cannotLoad(id: StateStoreId, version: Long, cause: Throwable): Throwable = {
    val ours = withContext(ErrorId.StateLoadFailed, s"Cannot load version $version of state store $id", cause)
    val precise = Iterator.iterate(cause)(_.getCause).takeWhile(_ != null).take(64).collectFirst {
      case f: CheckpointFileException if f.sparkCondition.isDefined => f.sparkCondition.get match {
        case CheckpointFileException.FileMissing(file) => StateStoreErrorsBridge.stateFileMissing(file, ours)
        case CheckpointFileException.SizeMismatch(source, local, expected, found) =>
          StateStoreErrorsBridge.unexpectedFileSize(source, local, expected, found, ours)
      }
      case b: StoreBusyException =>
        StateStoreErrorsBridge.unreleasedThread(id.toString, Thread.currentThread().getName, "load",
          b.holderThread, b.waitedMs, ours)
    }
    precise.getOrElse(StateStoreErrorsBridge.cannotLoad(ours))
  }

  def cannotCommit(id: StateStoreId, version: Long, cause: Throwable): Throwable =
    StateStoreErrorsBridge.cannotCommit(s"$id version $version",
      withContext(ErrorId.CommitFailed, s"Failed to commit version $version of state store $id", cause))

  // ---- the checkpoint's files: each names the file and the version ----

  /** A missing file; `file`, when given, is what Spark's load error names as `fileToRead`. */
  def fileMissing(detail: String, cause: Throwable = null, file: Path = null): CheckpointFileException =
    new CheckpointFileException(ErrorId.CheckpointFileMissing, detail, cause,
      Option(file).map(CheckpointFileException.FileMissing))

  /** A state file that arrived with another size than its manifest says. */
  def fileSizeMismatch(detail: String, source: Path, local: File, expected: Long, found: Long): CheckpointFileException =
    new CheckpointFileException(ErrorId.CheckpointFileCorrupt, detail,
      sparkCondition = Some(CheckpointFileException.SizeMismatch(source, local, expected, found)))

  /** A task waited too long for the partition another task holds. */
  def storeBusy(detail: String, holderThread: String, waitedMs: Long): StoreBusyException =
    new StoreBusyException(detail, holderThread, waitedMs)

  def fileCorrupt(detail: String, cause: Throwable = null): CheckpointFileException =
    new CheckpointFileException(ErrorId.CheckpointFileCorrupt, detail, cause)

  def loadFailed(detail: String, cause: Throwable = null): CheckpointFileException =
    new CheckpointFileException(ErrorId.StateLoadFailed, detail, cause)

  def checkpointWrite(detail: String, cause: Throwable = null): CheckpointFileException =
    new CheckpointFileException(ErrorId.CheckpointWriteFailed, detail, cause)

  // ---- store calls with arguments the store refuses (Spark's classes, as its RocksDB provider) ----

  def missingColumnFamily(operation: String, colFamily: String, registered: Iterable[String]): Throwable =
    StateStoreErrorsBridge.missingColumnFamily(operation, colFamily, unsupported(ErrorId.UnsupportedOperation,
      s"Cannot $operation: column family '$colFamily' is not in this state store; it has: " +
        registered.toSeq.sorted.mkString(", ")))

  def invalidColumnFamilyName(operation: String, colFamily: String): Throwable =
    StateStoreErrorsBridge.invalidColumnFamilyName(operation, colFamily, unsupported(ErrorId.UnsupportedOperation,
      s"Cannot $operation column family '$colFamily': allowed is a non-empty name without leading or " +
        s"trailing spaces, other than '${StateStore.DEFAULT_COL_FAMILY_NAME}'"))

  def reservedColumnFamilyName(colFamily: String): Throwable =
    StateStoreErrorsBridge.reservedColumnFamilyName(colFamily, unsupported(ErrorId.UnsupportedOperation,
      s"Cannot create column family '$colFamily': names starting with '_' are reserved for internal " +
        "column families"))

  def unsupportedCall(operation: String, detail: String): Throwable =
    StateStoreErrorsBridge.unsupportedOperation(operation, detail,
      unsupported(ErrorId.UnsupportedOperation, s"Cannot $operation: $detail"))

  // ---- options ----

  def invalidOption(detail: String): KeyedStateArgumentException =
    new KeyedStateArgumentException(ErrorId.InvalidOption, detail)

  /** An option value refused: the key, the value and what is allowed. */
  def invalidOptionValue(key: String, raw: String, allowed: String): KeyedStateArgumentException =
    invalidOption(s"Invalid value '$raw' for $key: allowed is $allowed")

  // ---- the rest, by the Java type callers catch ----

  /** A bad argument of a call or a tool (`IllegalArgumentException`). */
  def badArgument(error: ErrorId, detail: String): KeyedStateArgumentException =
    new KeyedStateArgumentException(error, detail)

  /** A state the call cannot proceed from (`IllegalStateException`). */
  def badState(error: ErrorId, detail: String, cause: Throwable = null): KeyedStateStateException =
    new KeyedStateStateException(error, detail, cause)

  /** A call the store, the tool or the operator does not support (`UnsupportedOperationException`). */
  def unsupported(error: ErrorId, detail: String): KeyedStateUnsupportedException =
    new KeyedStateUnsupportedException(error, detail)

  /**
   * A write to the executor's local disk failed: the working RocksDB instance, the changelog a
   * task records, a file a load downloads. The first line names the file, the operating
   * system's reason ("No space left on device") and the directory to free or move, instead of
   * leaving them to a native stack trace.
   */
  def localDiskWrite(what: String, file: File, localDir: File, localDirKey: String, cause: Throwable): LocalDiskException = {
    val reason = Option(cause.getMessage).filter(_.nonEmpty).getOrElse(cause.getClass.getName)
    new LocalDiskException(
      s"Cannot write $what $file on the executor's local disk: $reason. keyedstate works under " +
        s"$localDir ($localDirKey, else Spark's local directory): free space there or point localDir to a " +
        "larger disk", cause)
  }

  /**
   * Where it happened (store, version) before keyedstate's own message (file, what is wrong),
   * with the cause's identifier when it has one (`fallback` otherwise), so the one line a user
   * reads says both and the identifier appears once.
   */
  private def withContext(fallback: ErrorId, context: String, cause: Throwable): Throwable = {
    val detail = s"$context: ${KeyedStateError.detailOf(cause)}"
    cause match {
      // keyedstate's error keeps its Java type: a busy partition is no file, a file's stays an IOException.
      case k: KeyedStateStateException => new KeyedStateStateException(k.error, detail, cause)
      case k: KeyedStateArgumentException => new KeyedStateArgumentException(k.error, detail, cause)
      case k: KeyedStateError => new CheckpointFileException(k.error, detail, cause)
      case _ => new CheckpointFileException(fallback, detail, cause)
    }
  }
}

/** A write to the executor's local disk that failed, naming the file, the directory and why. */
class LocalDiskException(detail: String, cause: Throwable)
    extends KeyedStateIOException(ErrorId.LocalDiskWriteFailed, detail, cause)

/**
 * A store-level failure that names the file and version involved; `sparkCondition` is the
 * precise condition Spark's own load error raises for it, with what that names (see
 * [[KeyedStateErrors.cannotLoad]]).
 */
class CheckpointFileException(
    id: ErrorId,
    detail: String,
    cause: Throwable = null,
    val sparkCondition: Option[CheckpointFileException.SparkCondition] = None)
    extends KeyedStateIOException(id, detail, cause)

object CheckpointFileException {
  sealed trait SparkCondition
  /** `CANNOT_LOAD_STATE_STORE.CANNOT_READ_STREAMING_STATE_FILE`, `fileToRead` the file. */
  final case class FileMissing(file: Path) extends SparkCondition
  /** `CANNOT_LOAD_STATE_STORE.UNEXPECTED_FILE_SIZE`. */
  final case class SizeMismatch(source: Path, local: File, expected: Long, found: Long) extends SparkCondition
}

/** A task that waited too long for a partition another task of the executor holds. */
class StoreBusyException(detail: String, val holderThread: String, val waitedMs: Long)
    extends KeyedStateStateException(ErrorId.StoreBusy, detail)
