package org.apache.spark.sql.keyedstate

import org.apache.spark.SparkException
import org.apache.spark.sql.errors.QueryExecutionErrors
import org.apache.spark.sql.execution.streaming.state.StateStoreErrors

/**
 * Spark's own state-store errors (`private[sql]` factories), for keyedstate's provider: code
 * that catches Spark's error classes works with it. io.keyedstate.errors.KeyedStateErrors decides
 * which one each failure is.
 */
object StateStoreErrorsBridge {
  /** `CANNOT_LOAD_STATE_STORE.UNEXPECTED_VERSION`. */
  def unexpectedVersion(version: Long): Throwable = QueryExecutionErrors.unexpectedStateStoreVersion(version)

  /** `CANNOT_LOAD_STATE_STORE.*` with `cause` (what `StateStoreErrors.cannotLoadStore`, new in Spark 4.1, makes of keyedstate's causes). */
  def cannotLoad(cause: Throwable): Throwable = QueryExecutionErrors.cannotLoadStore(cause)

  /** `CANNOT_LOAD_STATE_STORE.CANNOT_READ_STREAMING_STATE_FILE`, naming the file as Spark's RocksDB provider does. */
  def stateFileMissing(file: org.apache.hadoop.fs.Path, cause: Throwable): Throwable =
    QueryExecutionErrors.failedToReadStreamingStateFileError(file, cause)

  /** `CANNOT_LOAD_STATE_STORE.UNEXPECTED_FILE_SIZE` (Spark's factory takes no cause: built with one). */
  def unexpectedFileSize(dfsFile: org.apache.hadoop.fs.Path, localFile: java.io.File, expected: Long, found: Long,
      cause: Throwable): Throwable =
    new SparkException("CANNOT_LOAD_STATE_STORE.UNEXPECTED_FILE_SIZE", Map("dfsFile" -> dfsFile.toString,
      "localFile" -> localFile.toString, "expectedSize" -> expected.toString, "localFileSize" -> found.toString), cause)

  /** `CANNOT_LOAD_STATE_STORE.UNRELEASED_THREAD_ERROR`: a partition another task still holds. */
  def unreleasedThread(store: String, thread: String, operation: String, holder: String, waitedMs: Long,
      cause: Throwable): Throwable =
    new SparkException("CANNOT_LOAD_STATE_STORE.UNRELEASED_THREAD_ERROR", Map("loggingId" -> store,
      "newAcquiredThreadInfo" -> thread, "operationType" -> operation, "acquiredThreadInfo" -> holder,
      "timeWaitedMs" -> waitedMs.toString, "stackTraceOutput" -> ""), cause)

  /** `CANNOT_WRITE_STATE_STORE.CANNOT_COMMIT`. */
  def cannotCommit(store: String, cause: Throwable): Throwable =
    QueryExecutionErrors.failedToCommitStateFileError(store, cause)

  // ---- store calls Spark's providers refuse with these classes (RocksDBStateStoreProvider) ----

  /** `STATE_STORE_UNSUPPORTED_OPERATION_ON_MISSING_COLUMN_FAMILY`. */
  def missingColumnFamily(operation: String, colFamily: String, cause: Throwable): Throwable =
    withCause(StateStoreErrors.unsupportedOperationOnMissingColumnFamily(operation, colFamily), cause)

  /** `STATE_STORE_CANNOT_USE_COLUMN_FAMILY_WITH_INVALID_NAME`. */
  def invalidColumnFamilyName(operation: String, colFamily: String, cause: Throwable): Throwable =
    withCause(StateStoreErrors.cannotUseColumnFamilyWithInvalidName(operation, colFamily), cause)

  /** `STATE_STORE_CANNOT_CREATE_COLUMN_FAMILY_WITH_RESERVED_CHARS`. */
  def reservedColumnFamilyName(colFamily: String, cause: Throwable): Throwable =
    withCause(StateStoreErrors.cannotCreateColumnFamilyWithReservedChars(colFamily), cause)

  /** `STATE_STORE_UNSUPPORTED_OPERATION`. */
  def unsupportedOperation(operation: String, entity: String, cause: Throwable): Throwable =
    withCause(StateStoreErrors.unsupportedOperationException(operation, entity), cause)

  /** Spark's factories take no cause: keyedstate's message is attached as one (still unset). */
  private def withCause(error: Throwable, cause: Throwable): Throwable = {
    error.initCause(cause)
    error
  }

}
