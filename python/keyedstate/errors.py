"""keyedstate's errors in Python, in one module: the exception classes, and the one place where a
JVM failure (a ``Py4JJavaError``, a pyspark ``CapturedException`` such as a failed query's
``StreamingQueryException``) becomes one of them.

Every error keyedstate raises in the JVM carries a stable identifier
(``io.keyedstate.errors.ErrorId``, ``[ID]`` at the start of its message; docs/errors.md lists
them). Spark wraps it, as the cause of its own state-store error class
(``CANNOT_LOAD_STATE_STORE.*``, ``CANNOT_WRITE_STATE_STORE.CANNOT_COMMIT``), of a failed task, of
``STREAM_FAILED``. :func:`state_error` digs it out of that chain and returns the Python class of
its family, with keyedstate's one line as the message, ``error_id`` the identifier and the
original error as ``__cause__``::

    try:
        query.awaitTermination()
    except StreamingQueryException as failure:
        error = keyedstate.errors.state_error(failure)
        if isinstance(error, keyedstate.errors.CheckpointError):
            ...  # error.error_id == "KEYEDSTATE_CHECKPOINT_FILE_MISSING", str(error) names the file

keyedstate's errors raised in Python (the state API's ``StateUsageError`` and
``StateTypeError``, the sinks' errors) are ``KeyedStateError`` subclasses too, with
``error_id`` ``None``; raised in a Python worker or a ``foreachBatch`` function they reach the
driver only as text, where :func:`state_error` finds them by class name.

The classes of the identifiers and the mapping from one to the other are generated from the
JVM's declaration (``keyedstate._error_catalog``, docs/errors.md); the classes of errors raised in
Python only are here. This module imports no other keyedstate module but that one, and py4j and
pyspark only when a JVM error is mapped.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any, ParamSpec, TypeVar

__all__ = [
    "BatchAlreadyCommitted",
    "CheckpointError",
    "CheckpointOperationError",
    "InvalidOptionError",
    "KafkaSinkError",
    "KeyedFunctionError",
    "KeyedStateError",
    "LocalDiskError",
    "QueryCheckpointError",
    "QueryServiceError",
    "RescaleError",
    "StateSchemaError",
    "StateStoreError",
    "SuppressRestartsException",
    "error_class",
    "from_java",
    "java_causes",
    "python_causes",
    "first_line",
    "error_of",
    "keyedstate_errors",
    "operation_error",
    "state_error",
]

from keyedstate._error_catalog import (
    ERROR_CLASSES,
    BatchAlreadyCommitted,
    CheckpointError,
    InvalidOptionError,
    KafkaSinkError,
    KeyedFunctionError,
    KeyedStateError,
    LocalDiskError,
    QueryCheckpointError,
    QueryServiceError,
    RescaleError,
    StateStoreError,
)

# Spark wraps a task's failure a few times; a longer chain is a cycle the JVM did not close.
MAX_CAUSES = 64
_JVM_ERROR = "io.keyedstate.errors.KeyedStateError"


class StateSchemaError(KeyedStateError):
    """Spark refused a restart whose state schema does not fit the checkpoint's
    (``STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE``, ``STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE``,
    ``error_id``), with the stateful operator named: Spark's own message names only the two
    schemas. Returned by ``state_error(failure, checkpoint=...)``."""


class CheckpointOperationError(KeyedStateError, RuntimeError):
    """A rescale, inspect, ``state.read`` or savepoint operation refused or failed; the message
    says why. A failure with a keyedstate identifier is also an instance of its family's class
    (a refused rescale is a ``RescaleError`` and a ``CheckpointOperationError``)."""


class SuppressRestartsException(Exception):  # noqa: N818 - Flink's name
    """A failure no restart can fix (``keyedstate.run``'s supervisor, docs/exactly-once.md).
    Raise it (in the query builder or in a ``foreachBatch`` function) to fail the supervised
    query without restarts, as Flink's ``SuppressRestartsException``. In ``foreachBatch``, raise
    this class itself (``raise SuppressRestartsException("...") from error``): Spark passes the
    Python error on as text, and the supervisor finds this class's name in it."""


def error_class(error_id: str) -> type[KeyedStateError]:
    """The Python class of an identifier. One this version does not know (from a newer jar)
    gets the class of the known identifiers it shares the most leading words with, two at least
    (``KEYEDSTATE_KAFKA_...``: ``KafkaSinkError``), else ``KeyedStateError``."""
    known = ERROR_CLASSES.get(error_id)
    if known is not None:
        return known
    words = error_id.split("_")

    def shared(other: str) -> int:
        n = 0
        for a, b in zip(words, other.split("_"), strict=False):
            if a != b:
                break
            n += 1
        return n

    best = max((shared(other) for other in ERROR_CLASSES), default=0)
    if best < 2:
        return KeyedStateError
    classes = Counter(cls for other, cls in ERROR_CLASSES.items() if shared(other) == best)
    return classes.most_common(1)[0][0]


@functools.cache
def _operation_class(cls: type[KeyedStateError]) -> type[CheckpointOperationError]:
    """``cls`` that is also a ``CheckpointOperationError``: what the tools raise, so code
    catching either class works."""
    if issubclass(cls, CheckpointOperationError):
        return cls
    if cls is KeyedStateError:  # the root is a base of CheckpointOperationError already
        return CheckpointOperationError
    combined = type(
        cls.__name__,
        (cls, CheckpointOperationError),
        {
            "__module__": __name__,
            "__qualname__": cls.__qualname__,
            "__doc__": cls.__doc__,
        },
    )
    return combined  # type: ignore[return-value]


def error_of(error_id: str, message: str) -> KeyedStateError:
    """The error of an identifier reported with a message (not raised in the JVM here: the query
    service's answer, a client's own failure): its family's class, with ``error_id`` set."""
    return error_class(error_id)(message, error_id)


def operation_error(error_id: str | None, message: str) -> CheckpointOperationError:
    """The error a tool raises for a failure known by its identifier and message (the query
    service's answer): its family's class that is also a ``CheckpointOperationError``."""
    if error_id is None:
        return CheckpointOperationError(message)
    return _operation_class(error_class(error_id))(message, error_id)


# ---- the JVM side, read through py4j ----


def java_causes(throwable: Any) -> list[Any]:  # noqa: ANN401 - a py4j JavaObject (a Throwable)
    """``throwable`` and its causes, outermost first (a cause that is itself ends the chain)."""
    chain = []
    inner = throwable
    while inner is not None and len(chain) < MAX_CAUSES:
        chain.append(inner)
        cause = inner.getCause()
        inner = None if cause is None or cause.equals(inner) else cause
    return chain


def first_line(throwable: Any) -> str:  # noqa: ANN401 - a py4j JavaObject (a Throwable)
    """The message's first line, whitespace collapsed ("" without a message): Spark's job
    failures embed executor stack traces in their messages, never shown."""
    text = str(throwable.getMessage() or "")
    return " ".join(text.splitlines()[0].split()) if text.strip() else ""


def java_interfaces(throwable: Any) -> set[str]:  # noqa: ANN401 - a py4j JavaObject
    """The interfaces ``throwable``'s class and its superclasses implement."""
    names: set[str] = set()
    cls = throwable.getClass()
    while cls is not None:
        names.update(str(i.getName()) for i in cls.getInterfaces())
        cls = cls.getSuperclass()
    return names


def keyedstate_cause(throwable: Any) -> Any:  # noqa: ANN401 - py4j JavaObjects
    """The outermost keyedstate error (an ``io.keyedstate.errors.KeyedStateError``) in
    ``throwable``'s cause chain, or ``None``. The outermost is the one with the most context:
    the store and the version before the file."""
    for link in java_causes(throwable):
        if str(link.getClass().getName()).startswith("io.keyedstate.") and (
            _JVM_ERROR in java_interfaces(link)
        ):
            return link
    return None


def from_java(
    throwable: Any,  # noqa: ANN401 - a py4j JavaObject (a Throwable)
    *,
    operation: bool = False,
) -> KeyedStateError | None:
    """The Python error of the keyedstate error in ``throwable``'s cause chain, or ``None``
    without one. ``operation``: raised by a tool, so also a ``CheckpointOperationError``."""
    ours = keyedstate_cause(throwable)
    if ours is None:
        return None
    error_id = str(ours.errorId())
    cls = error_class(error_id)
    if operation:
        cls = _operation_class(cls)
    return cls(first_line(ours) or f"[{error_id}]", error_id)


# ---- the Python side: the errors pyspark and py4j raise ----


def python_causes(error: BaseException) -> Iterator[BaseException]:
    """``error`` and its causes (``__cause__``, else ``__context__``), outermost first, each
    once, at most ``MAX_CAUSES``: the Python side of ``java_causes``."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen and len(seen) < MAX_CAUSES:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


# keyedstate's errors that reach the driver only as text, one line each. A JVM error pyspark has
# no class for (``UnknownException``: the JVM object is gone, its ``toString`` stays), or one in
# a stack trace quoted in another error's message (under ``foreachBatch`` the batch's failure
# goes back to the JVM as the text of a py4j error): keyedstate's class and its ``[ID]`` line,
# alone, after "Caused by: " or after py4j's ": ".
_JVM_LINE = re.compile(
    r"^(?:Caused by: |: )?io\.keyedstate\.[\w.$]+: "
    r"\[((?:KEYEDSTATE|KEYED_FUNCTION)_[A-Z_]+)\] (.*)$",
    re.MULTILINE,
)
# Spark Connect sends the server's error as its message (after the JVM class in parentheses,
# for a class PySpark has no exception of its own for): keyedstate's message starts with its
# ``[ID]``, whose prefixes are keyedstate's own (none of Spark's error classes has them).
_CONNECT_LINE = re.compile(
    r"\A(?:\([\w.$]+\) )?\[((?:KEYEDSTATE|KEYED_FUNCTION)_[A-Z_]+)\] (.*)$", re.MULTILINE
)
# A Python error, raised in a Python worker (a keyed function's task: Spark's PythonException
# quotes the worker's traceback) or in a ``foreachBatch`` function: the traceback's last line,
# the class by module and name, then the message.
_PYTHON_LINE = re.compile(r"^(keyedstate(?:\.\w+)+): (.*)$", re.MULTILINE)
_ID_PREFIX = re.compile(r"\[([A-Z][A-Z0-9_.]*)\] ")


def _texts(error: BaseException) -> Iterator[str]:
    """The text of ``error`` and its causes, outermost first: the captured causes pyspark kept
    only as text (``StreamingQuery.exception()`` converts the failure's causes so), and any
    other error's message."""
    for link in python_causes(error):
        captured: Any = link
        for _ in range(MAX_CAUSES):
            if captured is None:
                break
            desc = getattr(captured, "_desc", None)
            if desc:
                yield str(desc)
            captured = getattr(captured, "_cause", None)
        if not hasattr(link, "_desc"):
            # A Py4JJavaError's text comes from the JVM, which may be gone by now.
            try:
                text = str(link)
            except Exception:
                continue
            yield text
        # A Spark Connect error's server stack trace (its causes' "Caused by: <class>: [ID] ..."
        # lines), kept even when the client does not show it.
        stacktrace = getattr(link, "_stacktrace", None)
        if isinstance(stacktrace, str) and stacktrace:
            yield stacktrace


def _python_classes() -> dict[str, type[KeyedStateError]]:
    """keyedstate's exception classes by the name a traceback gives them (``module.Name``),
    the family's own class before the tools' combined ones of the same name."""
    found: dict[str, type[KeyedStateError]] = {}
    pending: list[type[KeyedStateError]] = [KeyedStateError]
    while pending:
        cls = pending.pop(0)
        found.setdefault(f"{cls.__module__}.{cls.__qualname__}", cls)
        pending.extend(cls.__subclasses__())
    return found


def _from_text(error: BaseException, operation: bool) -> KeyedStateError | None:
    """The keyedstate error found in the text of ``error`` and its causes: a JVM one by its
    ``[ID]`` line, else a Python one by its class's name."""
    texts = list(_texts(error))
    for text in texts:
        jvm = _JVM_LINE.search(text) or _CONNECT_LINE.search(text)
        if jvm is not None:
            error_id = jvm.group(1)
            cls = error_class(error_id)
            if operation:
                cls = _operation_class(cls)
            return cls(" ".join(f"[{error_id}] {jvm.group(2)}".split()), error_id)
    classes = _python_classes()
    for text in texts:
        for python in _PYTHON_LINE.finditer(text):
            cls = classes.get(python.group(1))
            if cls is None:
                continue
            message = " ".join(python.group(2).split())
            prefix = _ID_PREFIX.match(message)
            if operation:
                cls = _operation_class(cls)
            return cls(message, None if prefix is None else prefix.group(1))
    return None


def _java_throwables(error: BaseException) -> Iterator[Any]:
    """The JVM throwables behind ``error``: a ``Py4JJavaError``'s, a ``CapturedException``'s
    origin, and those of its captured causes (``StreamingQuery.exception()`` gives only the
    cause's)."""
    for link in python_causes(error):
        java = getattr(link, "java_exception", None)  # Py4JJavaError
        if java is not None:
            yield java
        captured: Any = link
        for _ in range(MAX_CAUSES):
            if captured is None:
                break
            origin = getattr(captured, "_origin", None)
            if origin is not None:
                yield origin
            captured = getattr(captured, "_cause", None)


def state_error(
    error: BaseException,
    *,
    checkpoint: str | os.PathLike[str] | None = None,
    operation: bool = False,
) -> KeyedStateError | None:
    """The keyedstate error behind ``error`` (a failed query's ``StreamingQueryException``, a
    ``Py4JJavaError``, any Python error raised from one), or ``None`` when keyedstate raised
    none. Its message is keyedstate's one line, ``error_id`` the identifier, ``__cause__``
    ``error``. A ``KeyedStateError`` is returned as it is.

    Where only text is left (under ``foreachBatch`` the batch's failure goes back to the JVM as
    a py4j error's text; a Python worker's error is Spark's ``PythonException`` quoting its
    traceback), a JVM error is found by its ``[ID]`` line and a Python one (``StateUsageError``,
    ``StateTypeError``, a sink's error) by its class's name on the traceback's last line.

    With the query's ``checkpoint``, Spark's refusal of a changed state schema on restart is a
    ``StateSchemaError`` naming the stateful operator whose stored schema it is (Spark's check
    runs on the driver before any provider is called, and names only the two schemas)."""
    for link in python_causes(error):
        if isinstance(link, KeyedStateError):
            return link
    throwables = list(_java_throwables(error))
    for throwable in throwables:
        mapped = from_java(throwable, operation=operation)
        if mapped is not None:
            mapped.__cause__ = error
            return mapped
    mapped = _from_text(error, operation)
    if mapped is not None:
        mapped.__cause__ = error
        return mapped
    if checkpoint is not None:
        for throwable in throwables:
            schema_error = _schema_error(throwable, os.fspath(checkpoint))
            if schema_error is not None:
                schema_error.__cause__ = error
                return schema_error
    return None


# ---- Spark's state schema check, with the operator named ----

SCHEMA_CONDITIONS = (
    "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE",
    "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE",
)
# What each of Spark's stateful operators is, by the short name its metadata records.
_OPERATOR_KINDS = {
    "stateStoreSave": "streaming aggregation",
    "sessionWindowStateStoreSaveExec": "session window",
    "dedupe": "dropDuplicates",
    "dedupeWithinWatermark": "dropDuplicatesWithinWatermark",
    "symmetricHashJoin": "stream-stream join",
    "flatMapGroupsWithState": "flatMapGroupsWithState",
    "applyInPandasWithState": "applyInPandasWithState",
    "transformWithStateExec": "transformWithState",
    "keyedProcess": "keyed function",
}


def _schema_error(throwable: Any, checkpoint: str) -> StateSchemaError | None:  # noqa: ANN401
    for link in java_causes(throwable):
        if "org.apache.spark.SparkThrowable" not in java_interfaces(link):
            continue
        condition = str(link.getCondition() or "")
        if condition not in SCHEMA_CONDITIONS:
            continue
        text = " ".join(str(link.getMessage() or "").split())
        side = "key" if "_KEY_" in condition else "value"
        pattern = rf"Existing {side}_schema=(.*?) and new {side}_schema=(.*?)\.(?: |$)"
        schemas = re.search(pattern, text)
        if schemas is None:
            return None
        existing, new = schemas.groups()
        operators = [
            label
            for label, stored in _stored_schemas(checkpoint)
            if stored[0 if side == "key" else 1] == existing
        ]
        if not operators:
            return None
        where = " or ".join(operators)
        return StateSchemaError(
            f"[{condition}] the state of {where} does not fit the restarted query: its stored "
            f"{side} schema is {existing}, the query's is {new} (Spark's check on restart, "
            f"spark.sql.streaming.stateStore.stateSchemaCheck)",
            condition,
        )
    return None


def _stored_schemas(checkpoint: str) -> Iterator[tuple[str, tuple[str, str]]]:
    """(operator label, (key schema, value schema)) of every column family of every store of
    every stateful operator of ``checkpoint``, as Spark's schema files hold them (read in the
    JVM with Spark's own reader, on the checkpoint's file system)."""
    from pyspark import SparkContext

    # The context, not the active session: a session is active per thread, and the failure may
    # be read in another thread than the one that started the query.
    sc = SparkContext._active_spark_context
    if sc is None:
        return
    entry = sc._jvm.io.keyedstate.offline.StoredSchemas  # type: ignore[union-attr]
    stored = json.loads(str(entry.json(checkpoint, sc._jsc.hadoopConfiguration())))  # type: ignore[union-attr]
    for family in stored:
        name = family["operatorName"] or "unknown operator"
        kind = f"{name}: {_OPERATOR_KINDS[name]}" if name in _OPERATOR_KINDS else name
        operator, store = family["operatorId"], family["storeName"]
        label = f"stateful operator {operator} ({kind}, state store '{store}')"
        yield label, (family["keySchema"], family["valueSchema"])


P = ParamSpec("P")
R = TypeVar("R")


def keyedstate_errors(function: Callable[P, R]) -> Callable[P, R]:
    """Decorates a function that calls the JVM: a failure holding a keyedstate error is raised
    as its Python class (from the original), anything else unchanged."""

    @functools.wraps(function)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return function(*args, **kwargs)
        except KeyedStateError:
            raise
        except Exception as error:
            mapped = state_error(error)
            if mapped is None:
                raise
            raise mapped from error

    return wrapper
