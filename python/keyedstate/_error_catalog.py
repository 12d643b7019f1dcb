"""keyedstate's error identifiers and the Python classes they are raised as, generated from the
JVM's declaration (``io.keyedstate.errors.ErrorId``): do not edit. Regenerate with
``KEYEDSTATE_WRITE_ERROR_DOCS=1 ./dev/sbt 'testOnly io.keyedstate.errors.ErrorCatalogSuite'``.
``keyedstate.errors`` exports them and maps JVM errors to them."""

from __future__ import annotations


class KeyedStateError(Exception):
    """Every error keyedstate raises, in the JVM or in Python: ``error_id`` is its stable identifier
    (docs/errors.md), ``None`` for one raised in Python only (a bad argument, say)."""

    def __init__(self, message: str = "", error_id: str | None = None) -> None:
        super().__init__(message)
        self.error_id = error_id


class CheckpointError(KeyedStateError):
    """A state checkpoint file is missing, damaged or could not be written, or a version could not
    be loaded or committed: the message names the store, the version and the file."""


class LocalDiskError(KeyedStateError):
    """A write on an executor's local disk failed (full, read-only, gone): the message names the
    file, the operating system's reason and the local directory (the ``localDir`` option)."""


class InvalidOptionError(KeyedStateError, ValueError):
    """An unknown keyedstate option, or a value it does not allow: the key, the value and what is
    allowed."""


class RescaleError(KeyedStateError):
    """``rescale`` refused (a bad partition count, an uncommitted batch, a running query, ...), or
    the checkpoint is held by an unfinished rescale."""


class QueryCheckpointError(KeyedStateError):
    """A tool (``inspect``, ``rescale``, ``state.read``, savepoints) was given no checkpoint, one
    without a committed batch or state, or an operator or state the checkpoint does not hold."""


class StateStoreError(KeyedStateError):
    """A state store call the store does not allow, a partition another task still holds or another
    thread closed, or a stored value that does not decode."""


class KeyedFunctionError(KeyedStateError):
    """A keyed function cannot run on this checkpoint or query (``KEYED_FUNCTION_*``: a changed key
    or state type, the complete output mode, a provider it cannot use)."""


class KafkaSinkError(KeyedStateError, RuntimeError):
    """A Kafka sink cannot write: bad configuration, unreachable brokers, a missing topic, a
    DataFrame that is not a Kafka record, or a transaction the broker refused."""


class BatchAlreadyCommitted(KeyedStateError):  # noqa: N818 - a signal, not an error
    """A signal, not a failure: a sink's ``begin_transaction``/``invoke``/``pre_commit`` found,
    inside its transaction, that another attempt committed the same batch meanwhile (a race
    ``is_committed`` could not see). The two-phase commit template aborts the transaction and skips
    the batch."""


class QueryServiceError(KeyedStateError):
    """A request to the query service (the driver's HTTP API, docs/query-service.md) it refused or
    could not answer: a bad request, a missing or wrong token, an unknown query or request, a
    service that does not answer."""


CHECKPOINT_FILE_MISSING = "KEYEDSTATE_CHECKPOINT_FILE_MISSING"
CHECKPOINT_FILE_CORRUPT = "KEYEDSTATE_CHECKPOINT_FILE_CORRUPT"
CHECKPOINT_WRITE_FAILED = "KEYEDSTATE_CHECKPOINT_WRITE_FAILED"
STATE_LOAD_FAILED = "KEYEDSTATE_STATE_LOAD_FAILED"
COMMIT_FAILED = "KEYEDSTATE_COMMIT_FAILED"
LOCAL_DISK_WRITE_FAILED = "KEYEDSTATE_LOCAL_DISK_WRITE_FAILED"
INVALID_OPTION = "KEYEDSTATE_INVALID_OPTION"
CONNECT_VERSION_MISMATCH = "KEYEDSTATE_CONNECT_VERSION_MISMATCH"
UNSUPPORTED_SPARK_VERSION = "KEYEDSTATE_UNSUPPORTED_SPARK_VERSION"
TRANSFORM_WITH_STATE_PROVIDER = "KEYEDSTATE_TRANSFORM_WITH_STATE_PROVIDER"
RESCALE_REFUSED = "KEYEDSTATE_RESCALE_REFUSED"
RESCALE_IN_PROGRESS = "KEYEDSTATE_RESCALE_IN_PROGRESS"
QUERY_CHECKPOINT_INVALID = "KEYEDSTATE_QUERY_CHECKPOINT_INVALID"
STORE_BUSY = "KEYEDSTATE_STORE_BUSY"
STORE_CLOSED = "KEYEDSTATE_STORE_CLOSED"
UNSUPPORTED_OPERATION = "KEYEDSTATE_UNSUPPORTED_OPERATION"
INVALID_STORE_ARGUMENT = "KEYEDSTATE_INVALID_STORE_ARGUMENT"
STORED_VALUE_CORRUPT = "KEYEDSTATE_STORED_VALUE_CORRUPT"
KEYED_FUNCTION_KEY_CHANGED = "KEYED_FUNCTION_KEY_CHANGED"
KEYED_FUNCTION_STATE_CHANGED = "KEYED_FUNCTION_STATE_CHANGED"
KEYED_FUNCTION_COMPLETE_MODE = "KEYED_FUNCTION_COMPLETE_MODE"
KEYED_FUNCTION_UID_CHANGED = "KEYED_FUNCTION_UID_CHANGED"
KEYED_FUNCTION_DUPLICATE_UID = "KEYED_FUNCTION_DUPLICATE_UID"
KEYED_FUNCTION_STATE_NOT_RESTORED = "KEYED_FUNCTION_STATE_NOT_RESTORED"
KEYED_FUNCTION_DECLARATION_MISSING = "KEYED_FUNCTION_DECLARATION_MISSING"
KEYED_FUNCTION_UNSUPPORTED_PROVIDER = "KEYED_FUNCTION_UNSUPPORTED_PROVIDER"
KEYED_FUNCTION_PIPELINED_RUNNER = "KEYED_FUNCTION_PIPELINED_RUNNER"
KAFKA_SINK_FAILED = "KEYEDSTATE_KAFKA_SINK_FAILED"
KAFKA_INVALID_RECORD = "KEYEDSTATE_KAFKA_INVALID_RECORD"
KAFKA_BATCH_ALREADY_COMMITTED = "KEYEDSTATE_KAFKA_BATCH_ALREADY_COMMITTED"
SERVICE_BAD_REQUEST = "KEYEDSTATE_SERVICE_BAD_REQUEST"
SERVICE_UNAUTHORIZED = "KEYEDSTATE_SERVICE_UNAUTHORIZED"
SERVICE_NOT_FOUND = "KEYEDSTATE_SERVICE_NOT_FOUND"
SERVICE_UNAVAILABLE = "KEYEDSTATE_SERVICE_UNAVAILABLE"
SERVICE_STATE_UNAVAILABLE = "KEYEDSTATE_SERVICE_STATE_UNAVAILABLE"
SERVICE_BATCH_NOT_REACHED = "KEYEDSTATE_SERVICE_BATCH_NOT_REACHED"

# Shown, pickled and caught as keyedstate.errors' classes (that module exports them).
for _class in (
    KeyedStateError,
    CheckpointError,
    LocalDiskError,
    InvalidOptionError,
    RescaleError,
    QueryCheckpointError,
    StateStoreError,
    KeyedFunctionError,
    KafkaSinkError,
    BatchAlreadyCommitted,
    QueryServiceError,
):
    _class.__module__ = "keyedstate.errors"

# Each identifier's class.
ERROR_CLASSES: dict[str, type[KeyedStateError]] = {
    CHECKPOINT_FILE_MISSING: CheckpointError,
    CHECKPOINT_FILE_CORRUPT: CheckpointError,
    CHECKPOINT_WRITE_FAILED: CheckpointError,
    STATE_LOAD_FAILED: CheckpointError,
    COMMIT_FAILED: CheckpointError,
    LOCAL_DISK_WRITE_FAILED: LocalDiskError,
    INVALID_OPTION: InvalidOptionError,
    CONNECT_VERSION_MISMATCH: InvalidOptionError,
    UNSUPPORTED_SPARK_VERSION: InvalidOptionError,
    TRANSFORM_WITH_STATE_PROVIDER: InvalidOptionError,
    RESCALE_REFUSED: RescaleError,
    RESCALE_IN_PROGRESS: RescaleError,
    QUERY_CHECKPOINT_INVALID: QueryCheckpointError,
    STORE_BUSY: StateStoreError,
    STORE_CLOSED: StateStoreError,
    UNSUPPORTED_OPERATION: StateStoreError,
    INVALID_STORE_ARGUMENT: StateStoreError,
    STORED_VALUE_CORRUPT: StateStoreError,
    KEYED_FUNCTION_KEY_CHANGED: KeyedFunctionError,
    KEYED_FUNCTION_STATE_CHANGED: KeyedFunctionError,
    KEYED_FUNCTION_COMPLETE_MODE: KeyedFunctionError,
    KEYED_FUNCTION_UID_CHANGED: KeyedFunctionError,
    KEYED_FUNCTION_DUPLICATE_UID: KeyedFunctionError,
    KEYED_FUNCTION_STATE_NOT_RESTORED: KeyedFunctionError,
    KEYED_FUNCTION_DECLARATION_MISSING: KeyedFunctionError,
    KEYED_FUNCTION_UNSUPPORTED_PROVIDER: KeyedFunctionError,
    KEYED_FUNCTION_PIPELINED_RUNNER: KeyedFunctionError,
    KAFKA_SINK_FAILED: KafkaSinkError,
    KAFKA_INVALID_RECORD: KafkaSinkError,
    KAFKA_BATCH_ALREADY_COMMITTED: BatchAlreadyCommitted,
    SERVICE_BAD_REQUEST: QueryServiceError,
    SERVICE_UNAUTHORIZED: QueryServiceError,
    SERVICE_NOT_FOUND: QueryServiceError,
    SERVICE_UNAVAILABLE: QueryServiceError,
    SERVICE_STATE_UNAVAILABLE: QueryServiceError,
    SERVICE_BATCH_NOT_REACHED: QueryServiceError,
}
