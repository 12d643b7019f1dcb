package org.apache.spark.sql.keyedstate

import org.apache.spark.sql.errors.QueryExecutionErrors
import org.apache.spark.sql.execution.streaming.state.StateStoreErrors

/**
 * Spark's own state-store errors (`private[sql]` factories), for keyedstate's provider: code
 * that catches Spark's error classes works with it. io.keyedstate.KeyedStateErrors decides
 * which one each failure is.
 */
object StateStoreErrorsBridge {
  /** `CANNOT_LOAD_STATE_STORE.UNEXPECTED_VERSION`. */
  def unexpectedVersion(version: Long): Throwable = QueryExecutionErrors.unexpectedStateStoreVersion(version)

  /** `CANNOT_LOAD_STATE_STORE.*` with `cause` (Spark keeps a cause that already has the class). */
  def cannotLoad(cause: Throwable): Throwable = StateStoreErrors.cannotLoadStore(cause)

  /** `CANNOT_WRITE_STATE_STORE.CANNOT_COMMIT`. */
  def cannotCommit(store: String, cause: Throwable): Throwable =
    QueryExecutionErrors.failedToCommitStateFileError(store, cause)
}
