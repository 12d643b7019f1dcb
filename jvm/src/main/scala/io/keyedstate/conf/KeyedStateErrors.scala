package io.keyedstate.conf

import java.io.IOException

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
 */
object KeyedStateErrors {
  def unexpectedVersion(version: Long): Throwable = StateStoreErrorsBridge.unexpectedVersion(version)

  def cannotLoad(id: StateStoreId, version: Long, cause: Throwable): Throwable =
    StateStoreErrorsBridge.cannotLoad(withContext(s"Cannot load version $version of state store $id", cause))

  def cannotCommit(id: StateStoreId, version: Long, cause: Throwable): Throwable =
    StateStoreErrorsBridge.cannotCommit(s"$id version $version",
      withContext(s"Failed to commit version $version of state store $id", cause))

  /** Where it happened (store, version) before keyedstate's own message (file, what is wrong). */
  private def withContext(context: String, cause: Throwable): Throwable =
    new CheckpointFileException(s"$context: ${cause.getMessage}", cause)
}

/** A store-level failure that names the file and version involved. */
class CheckpointFileException(message: String, cause: Throwable = null)
    extends IOException(message, cause)
