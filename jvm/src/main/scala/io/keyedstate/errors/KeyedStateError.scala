package io.keyedstate.errors

import java.io.IOException

/**
 * A failure keyedstate raised itself: its identifier, and its message without the `[ID] ` prefix
 * (what a wrapper that adds context quotes, so the identifier appears once).
 */
trait KeyedStateError { self: Throwable =>
  def error: ErrorId
  def detail: String
  /** The stable identifier, e.g. `KEYEDSTATE_CHECKPOINT_FILE_MISSING`. */
  final def errorId: String = error.name
}

object KeyedStateError {
  def message(error: ErrorId, detail: String): String = s"[${error.name}] $detail"

  /** A throwable's message without keyedstate's `[ID] ` prefix. */
  def detailOf(t: Throwable): String = t match {
    case k: KeyedStateError => k.detail
    case other => String.valueOf(other.getMessage)
  }

  /** The outermost keyedstate error of `t`'s cause chain. */
  def find(t: Throwable): Option[Throwable with KeyedStateError] =
    Iterator.iterate(t)(_.getCause).takeWhile(_ != null).take(64).collectFirst {
      case k: KeyedStateError => k
    }
}

// The Java types callers already catch, each with an identifier.

class KeyedStateIOException(val error: ErrorId, val detail: String, cause: Throwable = null)
    extends IOException(KeyedStateError.message(error, detail), cause) with KeyedStateError

class KeyedStateArgumentException(val error: ErrorId, val detail: String, cause: Throwable = null)
    extends IllegalArgumentException(KeyedStateError.message(error, detail), cause) with KeyedStateError

class KeyedStateStateException(val error: ErrorId, val detail: String, cause: Throwable = null)
    extends IllegalStateException(KeyedStateError.message(error, detail), cause) with KeyedStateError

class KeyedStateUnsupportedException(val error: ErrorId, val detail: String)
    extends UnsupportedOperationException(KeyedStateError.message(error, detail)) with KeyedStateError

class KeyedStateRuntimeException(val error: ErrorId, val detail: String, cause: Throwable = null)
    extends RuntimeException(KeyedStateError.message(error, detail), cause) with KeyedStateError
