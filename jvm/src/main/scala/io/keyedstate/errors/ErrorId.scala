package io.keyedstate.errors

/**
 * keyedstate's errors, declared once (Spark's `StateStoreErrors` is the model): each identifier
 * with its family and what it means, each family with the Python class it is caught as. Every
 * failure keyedstate raises itself carries an identifier: its message starts with `[ID]` and the
 * exception is a [[KeyedStateError]], whatever Java type it keeps for callers that catch by type.
 * [[ErrorCatalog]] writes the Python classes and their mapping (`python/keyedstate/_error_catalog.py`)
 * and docs/errors.md's table from this declaration, and `ErrorCatalogSuite` fails when they
 * drift. An identifier never changes meaning once released.
 *
 * This package imports no other keyedstate package (its bridge to Spark's own errors lives in
 * Spark's package), so every layer and the standalone Kafka sink may use it.
 */
sealed abstract class ErrorId(val name: String, val family: ErrorFamily, val meaning: String) {
  override def toString: String = name
}

/**
 * A family of identifiers and the Python class they are raised as: `pythonBases` are the
 * built-in exceptions it also is (a bad option is a `ValueError`), `doc` its docstring.
 */
sealed abstract class ErrorFamily(val name: String, val pythonClass: String, val pythonBases: Seq[String], val doc: String)

object ErrorFamily {
  case object Checkpoint extends ErrorFamily("checkpoint", "CheckpointError", Nil,
    "A state checkpoint file is missing, damaged or could not be written, or a version could not be loaded or " +
      "committed: the message names the store, the version and the file.")
  case object LocalDisk extends ErrorFamily("local disk", "LocalDiskError", Nil,
    "A write on an executor's local disk failed (full, read-only, gone): the message names the file, the " +
      "operating system's reason and the local directory (the ``localDir`` option).")
  case object Configuration extends ErrorFamily("configuration", "InvalidOptionError", Seq("ValueError"),
    "An unknown keyedstate option, or a value it does not allow: the key, the value and what is allowed.")
  case object Rescale extends ErrorFamily("rescale", "RescaleError", Nil,
    "``rescale`` refused (a bad partition count, an uncommitted batch, a running query, ...), or the checkpoint " +
      "is held by an unfinished rescale.")
  case object QueryCheckpoint extends ErrorFamily("query checkpoint", "QueryCheckpointError", Nil,
    "A tool (``inspect``, ``rescale``, ``state.read``, savepoints) was given no checkpoint, one without a " +
      "committed batch or state, or an operator or state the checkpoint does not hold.")
  case object Store extends ErrorFamily("store", "StateStoreError", Nil,
    "A state store call the store does not allow, a partition another task still holds or another thread " +
      "closed, or a stored value that does not decode.")
  case object KeyedFunction extends ErrorFamily("keyed function", "KeyedFunctionError", Nil,
    "A keyed function cannot run on this checkpoint or query (``KEYED_FUNCTION_*``: a changed key or state " +
      "type, the complete output mode, a provider it cannot use).")
  case object Kafka extends ErrorFamily("kafka sink", "KafkaSinkError", Seq("RuntimeError"),
    "A Kafka sink cannot write: bad configuration, unreachable brokers, a missing topic, a DataFrame that is " +
      "not a Kafka record, or a transaction the broker refused.")
  case object BatchCommitted extends ErrorFamily("batch already committed", "BatchAlreadyCommitted", Nil,
    "A signal, not a failure: a sink's ``begin_transaction``/``invoke``/``pre_commit`` found, inside its " +
      "transaction, that another attempt committed the same batch meanwhile (a race ``is_committed`` could not " +
      "see). The two-phase commit template aborts the transaction and skips the batch.")
  case object Service extends ErrorFamily("query service", "QueryServiceError", Nil,
    "A request to the query service (the driver's HTTP API, docs/query-service.md) it refused or could not " +
      "answer: a bad request, a missing or wrong token, an unknown query or request, a service that does not " +
      "answer.")

  val all: Seq[ErrorFamily] = Seq(Checkpoint, LocalDisk, Configuration, Rescale, QueryCheckpoint, Store, KeyedFunction,
    Kafka, BatchCommitted, Service)
}

object ErrorId {
  import ErrorFamily._

  case object CheckpointFileMissing extends ErrorId("KEYEDSTATE_CHECKPOINT_FILE_MISSING", Checkpoint,
    "a manifest, or a file a version's manifest lists, is not on the checkpoint file system (path and version " +
      "named)")
  case object CheckpointFileCorrupt extends ErrorId("KEYEDSTATE_CHECKPOINT_FILE_CORRUPT", Checkpoint,
    "a checkpoint file is truncated, fails its size or CRC32C check, or does not parse (a manifest, a changelog, " +
      "an unsupported format)")
  case object CheckpointWriteFailed extends ErrorId("KEYEDSTATE_CHECKPOINT_WRITE_FAILED", Checkpoint,
    "an upload, a manifest or a directory could not be written to the checkpoint file system; the storage's own " +
      "reason follows (the endpoint, the lost datanodes)")
  case object StateLoadFailed extends ErrorId("KEYEDSTATE_STATE_LOAD_FAILED", Checkpoint,
    "a version could not be loaded for a reason that is not a file's (RocksDB refused to open the restored " +
      "files, several commits of one version and no checkpoint id)")
  case object CommitFailed extends ErrorId("KEYEDSTATE_COMMIT_FAILED", Checkpoint,
    "a version could not be committed for a reason that is not a file's")
  case object LocalDiskWriteFailed extends ErrorId("KEYEDSTATE_LOCAL_DISK_WRITE_FAILED", LocalDisk,
    "a write on the executor's local disk failed (full, read-only, gone): the file, the operating system's " +
      "reason and the local directory (`localDir`)")
  case object InvalidOption extends ErrorId("KEYEDSTATE_INVALID_OPTION", Configuration,
    "an unknown keyedstate option or a value it does not allow (key, value, what is allowed), TTL asked of a " +
      "stream-stream join; also raised by `keyedstate.configure` in Python")
  case object ConnectVersionMismatch extends ErrorId("KEYEDSTATE_CONNECT_VERSION_MISMATCH", Configuration,
    "a Spark Connect client's keyedstate is not the server's version (both named): the client plans with its " +
      "keyedstate and the server runs its own, so they must be one version")
  case object UnsupportedSparkVersion extends ErrorId("KEYEDSTATE_UNSUPPORTED_SPARK_VERSION", Configuration,
    "keyedstate has no provider for the installed pyspark's Spark version (the version and the supported " +
      "ones named), or the provider jar on the classpath is for another Spark version than the one running, " +
      "or the running Spark lacks what a call needs (named, with the version that has it)")
  case object TransformWithStateProvider extends ErrorId("KEYEDSTATE_TRANSFORM_WITH_STATE_PROVIDER", Configuration,
    "Spark's `transformWithState` (or `transformWithStateInPandas`) in a query on keyedstate's provider: it " +
      "runs on Spark's RocksDB provider (Spark 4.2+ refuses other providers, keyedstate refuses it on every " +
      "version); keyed functions are keyedstate's per-key operator")
  case object RescaleRefused extends ErrorId("KEYEDSTATE_RESCALE_REFUSED", Rescale,
    "`rescale` refused before writing anything: a bad partition count, the count it already has, an " +
      "uncommitted batch, a running query, another provider's files, checkpoint format v2")
  case object RescaleInProgress extends ErrorId("KEYEDSTATE_RESCALE_IN_PROGRESS", Rescale,
    "the checkpoint is held by an unfinished rescale's journal: run the rescale again to complete it")
  case object QueryCheckpointInvalid extends ErrorId("KEYEDSTATE_QUERY_CHECKPOINT_INVALID", QueryCheckpoint,
    "a tool was given no checkpoint, one without a committed batch or state, a truncated offset log, another " +
      "provider's checkpoint, or an operator or state it does not hold")
  case object StoreBusy extends ErrorId("KEYEDSTATE_STORE_BUSY", Store,
    "a task waited `acquireTimeoutMs` (two minutes) for a state store partition another task of the executor holds, or its " +
      "instance was taken over")
  case object StoreClosed extends ErrorId("KEYEDSTATE_STORE_CLOSED", Store,
    "a state store operation met the partition's RocksDB instance closed by another thread (an abort, an " +
      "unload or a reload): operations in flight end first, later ones are refused, and no thread uses a " +
      "closed native handle")
  case object UnsupportedOperation extends ErrorId("KEYEDSTATE_UNSUPPORTED_OPERATION", Store,
    "a state store call the store or column family does not allow (a write on a read-only store, a merge on a " +
      "single-value column family, an unknown, dropped, invalid or reserved column family); the cause of " +
      "Spark's `STATE_STORE_*` condition where Spark's providers raise one (above)")
  case object InvalidStoreArgument extends ErrorId("KEYEDSTATE_INVALID_STORE_ARGUMENT", Store,
    "a state store call with a null key or a null value (an `IllegalArgumentException`)")
  case object StoredValueCorrupt extends ErrorId("KEYEDSTATE_STORED_VALUE_CORRUPT", Store,
    "a value in the partition's RocksDB instance does not decode as its column family's format (a damaged " +
      "local file, or state written by another format); names the column family")

  // The keyed functions' identifiers predate the KEYEDSTATE_ prefix and are documented as they are.
  case object KeyedFunctionKeyChanged extends ErrorId("KEYED_FUNCTION_KEY_CHANGED", KeyedFunction,
    "a keyed function restarted with other key columns or key types; names the stateful operator, its store " +
      "and both keys")
  case object KeyedFunctionStateChanged extends ErrorId("KEYED_FUNCTION_STATE_CHANGED", KeyedFunction,
    "a keyed function restarted with a state of another kind or type; names the state, its column family, " +
      "the operator and both declarations")
  case object KeyedFunctionCompleteMode extends ErrorId("KEYED_FUNCTION_COMPLETE_MODE", KeyedFunction,
    "a keyed function in a query with the complete output mode")
  case object KeyedFunctionUidChanged extends ErrorId("KEYED_FUNCTION_UID_CHANGED", KeyedFunction,
    "a keyed function restarted at an operator id whose state another function wrote (another uid, or " +
      "another class where none was given): functions reordered, added or removed; names the operator and " +
      "both functions")
  case object KeyedFunctionDuplicateUid extends ErrorId("KEYED_FUNCTION_DUPLICATE_UID", KeyedFunction,
    "two keyed functions of one query with the same uid; names the uid and the functions")
  case object KeyedFunctionStateNotRestored extends ErrorId("KEYED_FUNCTION_STATE_NOT_RESTORED", KeyedFunction,
    "a query started on a restored savepoint lacks one of the savepoint's keyed functions (matched by uid, " +
      "else by position and class) or states, and the restore did not allow non-restored state; names the " +
      "function, its operator and the state")
  case object KeyedFunctionDeclarationMissing extends ErrorId("KEYED_FUNCTION_DECLARATION_MISSING",
    KeyedFunction, "a keyed function's state version whose manifest records no declaration of its states " +
      "(written by an older build or another operator): names the version, the operator and the manifest")
  case object KeyedFunctionUnsupportedProvider extends ErrorId("KEYED_FUNCTION_UNSUPPORTED_PROVIDER",
    KeyedFunction, "a keyed function on a provider other than keyedstate's (the declaration lives in its manifests)")
  case object KeyedFunctionPipelinedRunner extends ErrorId("KEYED_FUNCTION_PIPELINED_RUNNER", KeyedFunction,
    "a keyed function with a state whose reads write (incremental TTL cleanup on every record) in a session " +
      "started with `spark.python.udf.pipelined.enabled=true` (the first micro-batch fails); names the states")

  case object KafkaSinkFailed extends ErrorId("KEYEDSTATE_KAFKA_SINK_FAILED", Kafka,
    "the Kafka sink could not write: configuration, brokers, topic, a transaction the broker refused")
  case object KafkaInvalidRecord extends ErrorId("KEYEDSTATE_KAFKA_INVALID_RECORD", Kafka,
    "a row of the batch is not a Kafka record (a header with a null key, ...)")
  case object KafkaBatchAlreadyCommitted extends ErrorId("KEYEDSTATE_KAFKA_BATCH_ALREADY_COMMITTED", BatchCommitted,
    "a signal, not a failure: another attempt committed the batch meanwhile (the sink skips the batch)")

  case object ServiceBadRequest extends ErrorId("KEYEDSTATE_SERVICE_BAD_REQUEST", Service,
    "a request the query service cannot take: a body that is not the JSON it expects, a field missing or of a " +
      "value it does not allow (named with what is allowed), a method the path does not serve")
  case object ServiceUnauthorized extends ErrorId("KEYEDSTATE_SERVICE_UNAUTHORIZED", Service,
    "a request without the service's bearer token, or with another (`spark.keyedstate.service.token`)")
  case object ServiceNotFound extends ErrorId("KEYEDSTATE_SERVICE_NOT_FOUND", Service,
    "a path the service does not have, a query that does not run in the application, a request id it does not know")
  case object ServiceUnavailable extends ErrorId("KEYEDSTATE_SERVICE_UNAVAILABLE", Service,
    "the client could not reach the service (its address, and the operating system's reason), or its answer was " +
      "not the service's")
  case object ServiceStateUnavailable extends ErrorId("KEYEDSTATE_SERVICE_STATE_UNAVAILABLE", Service,
    "a lookup of queryable state the service cannot answer now (HTTP 503): the query has not committed a batch " +
      "yet, or no state server holds the committed version of a key's partition (a restart, a lost executor); " +
      "asking again later may succeed")
  case object ServiceBatchNotReached extends ErrorId("KEYEDSTATE_SERVICE_BATCH_NOT_REACHED", Service,
    "a lookup asked for the state of at least a batch (`min_batch`) that the query did not commit within the " +
      "request's timeout (HTTP 504; the last committed batch is named)")

  /** Every identifier, in the order docs/errors.md lists them (`ErrorCatalogSuite` checks none is left out). */
  val all: Seq[ErrorId] = Seq(CheckpointFileMissing, CheckpointFileCorrupt, CheckpointWriteFailed,
    StateLoadFailed, CommitFailed, LocalDiskWriteFailed, InvalidOption, ConnectVersionMismatch, UnsupportedSparkVersion,
    TransformWithStateProvider,
    RescaleRefused, RescaleInProgress,
    QueryCheckpointInvalid, StoreBusy, StoreClosed, UnsupportedOperation, InvalidStoreArgument, StoredValueCorrupt,
    KeyedFunctionKeyChanged, KeyedFunctionStateChanged, KeyedFunctionCompleteMode, KeyedFunctionUidChanged,
    KeyedFunctionDuplicateUid, KeyedFunctionStateNotRestored, KeyedFunctionDeclarationMissing,
    KeyedFunctionUnsupportedProvider, KeyedFunctionPipelinedRunner, KafkaSinkFailed, KafkaInvalidRecord,
    KafkaBatchAlreadyCommitted, ServiceBadRequest, ServiceUnauthorized, ServiceNotFound, ServiceUnavailable,
    ServiceStateUnavailable, ServiceBatchNotReached)

  def named(name: String): Option[ErrorId] = all.find(_.name == name)
}
