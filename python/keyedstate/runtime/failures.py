"""Which failures of a supervised query a restart can fix.

A restart re-runs the same query code on the same checkpoint. It helps with what can change
between attempts (a lost executor, an unreachable server, a full disk, a bug in user code that
depends on the data's timing) and cannot help with what is wrong in the query or its checkpoint:
a bad setting, a query that does not analyse, a checkpoint or state schema the query cannot use.
Those are final at once, whatever the restart strategy (docs/exactly-once.md, "Restart
strategies", has the rule as a table).

The rule looks at every link of the error's cause chain, Python (``__cause__``/``__context__``)
and JVM (``getCause``), because Spark wraps the error that matters in ``STREAM_FAILED``,
``FOREACH_BATCH_USER_FUNCTION_ERROR`` or a task failure.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.errors import AnalysisException, PySparkException
from pyspark.errors import IllegalArgumentException as PySparkIllegalArgumentException

from keyedstate._error_catalog import KEYED_FUNCTION_COMPLETE_MODE
from keyedstate.errors import (
    SuppressRestartsException,
    java_causes,
    java_interfaces,
    python_causes,
)

__all__ = [
    "CHECKPOINT_FAILURE_CONDITIONS",
    "NON_RETRIABLE_CONDITIONS",
    "NON_RETRIABLE_JVM_CLASSES",
    "CheckpointTimeoutError",
    "Classification",
    "QueryFailedError",
    "SuppressRestartsException",
    "classify",
    "summarize",
]


class CheckpointTimeoutError(RuntimeError):
    """A batch ran past ``CheckpointConfig``'s timeout and ``fail_on_timeout`` stopped it."""

    def __init__(self, query: str, batch_id: int | None, timeout_ms: int, elapsed_s: float) -> None:
        self.query = query
        self.batch_id = batch_id
        self.timeout_ms = timeout_ms
        self.elapsed_s = elapsed_s
        batch = f"batch {batch_id}" if batch_id is not None else "a batch"
        super().__init__(
            f"{batch} of query {query} ran past the checkpoint timeout of {timeout_ms} ms "
            f"(running for {elapsed_s:.1f} s); the query was stopped (fail_on_timeout=True). The "
            "batch did not commit: it is replayed from the checkpoint on the next start."
        )


class QueryFailedError(RuntimeError):
    """The supervised query failed and is not restarted; ``__cause__`` is the last failure."""

    def __init__(self, message: str, cause: BaseException, restarts: int, retriable: bool) -> None:
        super().__init__(message)
        self.cause = cause
        self.restarts = restarts
        self.retriable = retriable


# Spark error conditions (and their families, before the first '.') that no restart fixes: the
# checkpoint or its state does not fit the query, or the query is not valid as a stream.
NON_RETRIABLE_CONDITIONS: frozenset[str] = frozenset(
    {
        # State written by another query shape or schema (keyedstate raises these too).
        "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE",
        "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE",
        "STATE_STORE_COLUMN_FAMILY_SCHEMA_INCOMPATIBLE",
        "STATE_STORE_INVALID_VALUE_SCHEMA_EVOLUTION",
        "STATE_STORE_INVALID_VARIABLE_TYPE_CHANGE",
        "STATE_STORE_VALUE_SCHEMA_EVOLUTION_THRESHOLD_EXCEEDED",
        "STATE_STORE_STATE_SCHEMA_FILES_THRESHOLD_EXCEEDED",
        "STATE_STORE_INVALID_CONFIG_AFTER_RESTART",
        "STATE_STORE_INVALID_PROVIDER",
        "STATE_STORE_CHECKPOINT_IDS_NOT_SUPPORTED",
        "STATE_STORE_PROVIDER_DOES_NOT_SUPPORT_FINE_GRAINED_STATE_REPLAY",
        "STREAMING_STATEFUL_OPERATOR_NOT_MATCH_IN_STATE_METADATA",
        "STREAMING_STATEFUL_OPERATOR_MISSING_STATE_DIRECTORY",
        "STREAMING_CHECKPOINT_MISSING_METADATA_FILE",
        "STREAM_STREAM_JOIN_INCOMPATIBLE_STATE_STORE_CONFIGS",
        "STREAMING_UNFINISHED_REPARTITION_DETECTED",
        "STATE_REPARTITION_INVALID_CHECKPOINT",
        # The query itself is not a valid stream.
        "STREAMING_QUERY_EVOLUTION_ERROR",
        "STREAMING_OUTPUT_MODE",
        "UNSUPPORTED_STREAMING_OPERATOR_WITHOUT_WATERMARK",
        KEYED_FUNCTION_COMPLETE_MODE,
    }
)

# JVM exception classes (or their subclasses) that mean a bad setting or query: keyedstate's
# option checks (KeyedStateConf) and Spark's option checks throw IllegalArgumentException.
NON_RETRIABLE_JVM_CLASSES: tuple[str, ...] = (
    "java.lang.IllegalArgumentException",
    "org.apache.spark.sql.AnalysisException",
)

# Failures of the checkpoint itself (Flink's "failed checkpoints", which
# CheckpointConfig.tolerable_checkpoint_failure_number tolerates): the state store's commit, the
# offset or commit log's write, and a batch stopped for running past the checkpoint timeout.
CHECKPOINT_FAILURE_CONDITIONS: frozenset[str] = frozenset(
    {
        "CANNOT_WRITE_STATE_STORE",
        "STREAMING_CHECKPOINT_LOG_WRITE_FAILURE",
    }
)

_SUPPRESS_NAME = f"{SuppressRestartsException.__module__}.{SuppressRestartsException.__qualname__}"


@dataclass(frozen=True)
class Classification:
    """What the supervisor does with a failure: ``retriable`` (else final at once, ``reason``
    says why), and whether it is a failed checkpoint."""

    retriable: bool
    reason: str
    checkpoint_failure: bool


@dataclass(frozen=True)
class _Link:
    classes: tuple[str, ...]  # the class and its superclasses (JVM) or the Python type's name
    condition: str | None
    message: str


def _family(condition: str) -> str:
    return condition.split(".", 1)[0]


def _jvm_links(throwable: Any) -> Iterator[_Link]:  # noqa: ANN401 - a py4j JavaObject
    """The JVM cause chain of ``throwable``, read through py4j."""
    for link in java_causes(throwable):
        classes = []
        cls = link.getClass()
        while cls is not None:
            classes.append(str(cls.getName()))
            cls = cls.getSuperclass()
        condition = None
        if "org.apache.spark.SparkThrowable" in java_interfaces(link):
            condition = link.getCondition()
        yield _Link(
            tuple(classes), str(condition) if condition else None, str(link.getMessage() or "")
        )


# A JVM error as Spark Connect's client gets it, as text: its message (after the class in
# parentheses, for a class PySpark has no exception for) and the server's stack trace, whose
# "Caused by: <class>: [CONDITION] message" lines are the cause chain.
_CONNECT_CAUSE = re.compile(
    r"^(?:Caused by: |\()?([a-z][\w$]*(?:\.[\w$]+)+)(?:: |\) |$)(?:\[([A-Z][A-Z0-9_.]*)\] )?(.*)$",
    re.MULTILINE,
)
# The JVM classes a failure of a bad setting or query is often of, by the class of
# NON_RETRIABLE_JVM_CLASSES they extend (the text names the class, not its superclasses).
_JVM_PARENTS = {
    "io.keyedstate.errors.KeyedStateArgumentException": "java.lang.IllegalArgumentException",
    "org.apache.spark.SparkIllegalArgumentException": "java.lang.IllegalArgumentException",
    "java.lang.NumberFormatException": "java.lang.IllegalArgumentException",
    "java.util.regex.PatternSyntaxException": "java.lang.IllegalArgumentException",
    "org.apache.spark.sql.catalyst.ExtendedAnalysisException": (
        "org.apache.spark.sql.AnalysisException"
    ),
}


def _connect_links(link: BaseException) -> Iterator[_Link]:
    """The JVM cause chain of a Spark Connect error, read from its text."""
    texts = [str(link), str(getattr(link, "_stacktrace", None) or "")]
    for text in texts:
        for found in _CONNECT_CAUSE.finditer(text):
            cls, condition, message = found.groups()
            classes = (cls, _JVM_PARENTS[cls]) if cls in _JVM_PARENTS else (cls,)
            yield _Link(classes, condition, message)


def _links(error: BaseException, jvm_error: Any) -> Iterator[_Link]:  # noqa: ANN401
    for link in python_causes(error):
        condition = link.getCondition() if isinstance(link, PySparkException) else None
        yield _Link((type(link).__name__,), condition, str(link))
        origin = getattr(link, "_origin", None)
        if origin is not None:
            yield from _jvm_links(origin)
        if type(link).__module__.startswith("pyspark.errors.exceptions.connect"):
            yield from _connect_links(link)
    if jvm_error is not None:
        yield from _jvm_links(jvm_error)


def classify(
    error: BaseException,
    *,
    jvm_error: Any = None,  # noqa: ANN401 - the query's JVM exception, when there is one
    while_starting: bool = False,
) -> Classification:
    """Classify a failure of a supervised query.

    ``while_starting``: the error came from the query builder (building or starting the query),
    where a ``ValueError``/``TypeError`` is a bad argument or setting, not a data problem.
    """
    for link in python_causes(error):
        if isinstance(link, SuppressRestartsException):
            return Classification(False, "SuppressRestartsException was raised", False)
        if isinstance(link, AnalysisException):
            return Classification(False, "the query does not analyse (AnalysisException)", False)
        if isinstance(link, PySparkIllegalArgumentException):
            return Classification(
                False, "a setting or argument is invalid (IllegalArgumentException)", False
            )
        if while_starting and isinstance(link, ValueError | TypeError):
            return Classification(
                False,
                f"building the query raised {type(link).__name__}, a bad argument or setting",
                False,
            )
        if isinstance(link, CheckpointTimeoutError):
            return Classification(True, "", True)
    checkpoint_failure = False
    for link in _links(error, jvm_error):
        if link.condition and _family(link.condition) in NON_RETRIABLE_CONDITIONS:
            return Classification(
                False,
                f"error condition {link.condition}: the checkpoint or the query's state does not "
                "fit the query (or the query is not a valid stream), which a restart cannot fix",
                False,
            )
        jvm_bad = [c for c in NON_RETRIABLE_JVM_CLASSES if c in link.classes]
        if jvm_bad:
            return Classification(
                False,
                f"{link.classes[0]} (a {jvm_bad[0].rsplit('.', 1)[-1]}): a setting, an option "
                "value or the query is invalid",
                False,
            )
        if _SUPPRESS_NAME + ":" in link.message:
            return Classification(False, "SuppressRestartsException was raised", False)
        if link.condition and _family(link.condition) in CHECKPOINT_FAILURE_CONDITIONS:
            checkpoint_failure = True
    return Classification(True, "", checkpoint_failure)


def summarize(error: BaseException, limit: int = 400) -> str:
    """One line about ``error`` for logs and messages: its type and the line that says what went
    wrong (for a Python error passed through Spark, the traceback's last exception line)."""
    text = str(error)
    lines = text.splitlines()
    chosen = lines[0] if lines else ""
    in_traceback = False
    for line in lines:
        if line.startswith("Traceback (most recent call last)") or line.endswith(
            "Traceback (most recent call last):"
        ):
            in_traceback = True
        elif in_traceback and line and not line[0].isspace():
            chosen, in_traceback = line, False
    if len(chosen) > limit:
        chosen = chosen[: limit - 3] + "..."
    return f"{type(error).__name__}: {chosen}"
