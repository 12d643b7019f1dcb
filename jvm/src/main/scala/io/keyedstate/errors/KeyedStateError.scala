package io.keyedstate.errors

import java.io.IOException

/**
 * keyedstate's stable error identifiers, in one place (Spark's `StateStoreErrors` is the model).
 * Every failure keyedstate raises itself carries one: its message starts with `[ID]` and the
 * exception is a [[KeyedStateError]], whatever Java type it keeps for callers that catch by type.
 * Python maps the identifiers to its exception classes by family (`keyedstate.errors`), and
 * docs/errors.md lists them: an identifier never changes meaning once released.
 *
 * This package imports nothing of keyedstate, so every layer and the standalone Kafka sink may
 * use it.
 */
sealed abstract class ErrorId(val name: String, val family: ErrorFamily, val meaning: String) {
  override def toString: String = name
}

/** A family of identifiers: one Python exception class each. */
sealed abstract class ErrorFamily(val name: String)

object ErrorFamily {
  case object Checkpoint extends ErrorFamily("checkpoint")
  case object LocalDisk extends ErrorFamily("local disk")
  case object Configuration extends ErrorFamily("configuration")
  case object Rescale extends ErrorFamily("rescale")
  case object QueryCheckpoint extends ErrorFamily("query checkpoint")
  case object Store extends ErrorFamily("store")
  case object KeyedFunction extends ErrorFamily("keyed function")
  case object KafkaSink extends ErrorFamily("kafka sink")
}

object ErrorId {
  import ErrorFamily._

  case object CheckpointFileMissing extends ErrorId("KEYEDSTATE_CHECKPOINT_FILE_MISSING", Checkpoint,
    "a manifest, or a file a version's manifest lists, is not on the checkpoint file system")
  case object CheckpointFileCorrupt extends ErrorId("KEYEDSTATE_CHECKPOINT_FILE_CORRUPT", Checkpoint,
    "a checkpoint file is truncated, fails its size or CRC32C check, or does not parse (a manifest, " +
      "a changelog, an unsupported format)")
  case object CheckpointWriteFailed extends ErrorId("KEYEDSTATE_CHECKPOINT_WRITE_FAILED", Checkpoint,
    "an upload, a manifest or a directory could not be written to the checkpoint file system (the " +
      "storage's own reason follows)")
  case object StateLoadFailed extends ErrorId("KEYEDSTATE_STATE_LOAD_FAILED", Checkpoint,
    "a version could not be loaded for a reason that is not one of a file (RocksDB refused to open, say)")
  case object CommitFailed extends ErrorId("KEYEDSTATE_COMMIT_FAILED", Checkpoint,
    "a version could not be committed for a reason that is not one of a file (the instance was taken over)")
  case object LocalDiskWriteFailed extends ErrorId("KEYEDSTATE_LOCAL_DISK_WRITE_FAILED", LocalDisk,
    "a write on the executor's local disk failed (full, read-only, gone): the file, the reason and the " +
      "local directory are named")
  case object InvalidOption extends ErrorId("KEYEDSTATE_INVALID_OPTION", Configuration,
    "an unknown keyedstate option, or a value it does not allow (the key, the value and what is allowed)")
  case object RescaleRefused extends ErrorId("KEYEDSTATE_RESCALE_REFUSED", Rescale,
    "`keyedstate rescale` refused before writing anything: a bad partition count, an uncommitted batch, a " +
      "running query, a provider or operator it cannot rescale")
  case object RescaleInProgress extends ErrorId("KEYEDSTATE_RESCALE_IN_PROGRESS", Rescale,
    "the checkpoint is held by an unfinished rescale (its journal): run the rescale again to complete it")
  case object QueryCheckpointInvalid extends ErrorId("KEYEDSTATE_QUERY_CHECKPOINT_INVALID", QueryCheckpoint,
    "a tool (inspect, rescale, read_state) was given no checkpoint, one without a committed batch or state, " +
      "a damaged offset log, or an operator or state the checkpoint does not hold")
  case object StoreBusy extends ErrorId("KEYEDSTATE_STORE_BUSY", Store,
    "a task waited two minutes for a state store partition another task of the executor still holds")
  case object StoreClosed extends ErrorId("KEYEDSTATE_STORE_CLOSED", Store,
    "a state store operation met the partition's RocksDB instance closed by another thread (the store " +
      "aborted, unloaded or reloaded): it waited for the operations in flight, and refuses later ones")
  case object UnsupportedOperation extends ErrorId("KEYEDSTATE_UNSUPPORTED_OPERATION", Store,
    "a state store call the store or its column family does not allow (a write on a read-only store, " +
      "multiple values on a single-value column family, an unknown column family, a reserved or invalid " +
      "column family name), the cause of Spark's STATE_STORE_* error class where Spark has one")
  case object InvalidStoreArgument extends ErrorId("KEYEDSTATE_INVALID_STORE_ARGUMENT", Store,
    "a state store call with a null key or a null value")
  case object KafkaSinkFailed extends ErrorId("KEYEDSTATE_KAFKA_SINK_FAILED", KafkaSink,
    "the Kafka sink could not write: configuration, brokers, topic, or a transaction the broker refused")
  case object KafkaInvalidRecord extends ErrorId("KEYEDSTATE_KAFKA_INVALID_RECORD", KafkaSink,
    "a row of the batch is not a valid Kafka record (a header with a null key, ...)")
  case object KafkaBatchAlreadyCommitted extends ErrorId("KEYEDSTATE_KAFKA_BATCH_ALREADY_COMMITTED", KafkaSink,
    "a signal, not a failure: another attempt committed the batch's transaction meanwhile")

  // The keyed functions' identifiers predate the KEYEDSTATE_ prefix and are documented as they are.
  case object KeyedFunctionKeyChanged extends ErrorId("KEYED_FUNCTION_KEY_CHANGED", KeyedFunction,
    "a keyed function restarted on a checkpoint with other key columns or key types")
  case object KeyedFunctionStateChanged extends ErrorId("KEYED_FUNCTION_STATE_CHANGED", KeyedFunction,
    "a keyed function restarted on a checkpoint with a state of another kind or type")
  case object KeyedFunctionCompleteMode extends ErrorId("KEYED_FUNCTION_COMPLETE_MODE", KeyedFunction,
    "a keyed function in a query with the complete output mode")
  case object KeyedFunctionUnsupportedProvider extends ErrorId("KEYED_FUNCTION_UNSUPPORTED_PROVIDER",
    KeyedFunction, "a keyed function on a state store provider it cannot use")
  case object KeyedFunctionUidChanged extends ErrorId("KEYED_FUNCTION_UID_CHANGED", KeyedFunction,
    "a keyed function restarted at an operator id whose state another uid (another function) wrote")
  case object KeyedFunctionDuplicateUid extends ErrorId("KEYED_FUNCTION_DUPLICATE_UID", KeyedFunction,
    "two keyed functions of one query with the same uid")
  case object KeyedFunctionStateNotRestored extends ErrorId("KEYED_FUNCTION_STATE_NOT_RESTORED", KeyedFunction,
    "a savepoint's keyed function or state that the restored query no longer has, without allow_non_restored_state")
  case object KeyedFunctionDeclarationMissing extends ErrorId("KEYED_FUNCTION_DECLARATION_MISSING",
    KeyedFunction, "a keyed function's state version whose manifest records no declaration of its states")
  case object KeyedFunctionPipelinedRunner extends ErrorId("KEYED_FUNCTION_PIPELINED_RUNNER", KeyedFunction,
    "a keyed function whose state reads write (TTL cleanup on every record) under Spark's pipelined " +
      "Python runner")

  val all: Seq[ErrorId] = Seq(CheckpointFileMissing, CheckpointFileCorrupt, CheckpointWriteFailed,
    StateLoadFailed, CommitFailed, LocalDiskWriteFailed, InvalidOption, RescaleRefused, RescaleInProgress,
    QueryCheckpointInvalid, StoreBusy, StoreClosed, UnsupportedOperation, InvalidStoreArgument, KeyedFunctionKeyChanged,
    KeyedFunctionStateChanged, KeyedFunctionCompleteMode, KeyedFunctionUnsupportedProvider,
    KeyedFunctionUidChanged, KeyedFunctionDuplicateUid, KeyedFunctionStateNotRestored, KeyedFunctionDeclarationMissing, KeyedFunctionPipelinedRunner, KafkaSinkFailed, KafkaInvalidRecord,
    KafkaBatchAlreadyCommitted)

  def named(name: String): Option[ErrorId] = all.find(_.name == name)
}

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
