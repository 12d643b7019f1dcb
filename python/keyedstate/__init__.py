"""keyedstate: Flink-style keyed state for Spark Structured Streaming.

The provider (``configure``, ``jar_path``, ``PROVIDER_CLASS``) and the Flink-style Python state
API (``key_by``, the functions, descriptors and state types); see docs/python-api.md.

A lazy facade (PEP 562): each name is imported from its module when first used, so that
``import keyedstate.errors`` or ``import keyedstate.state`` loads neither the offline
operations, the runtime, the sinks nor the engine (tests/project/test_layout.py checks it).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from keyedstate._session import (
        OPTION_PREFIX,
        PROVIDER_CLASS,
        configure,
        jar_path,
    )
    from keyedstate.errors import (
        CheckpointError,
        CheckpointOperationError,
        InvalidOptionError,
        KeyedFunctionError,
        KeyedStateError,
        LocalDiskError,
        QueryCheckpointError,
        RescaleError,
        StateSchemaError,
        StateStoreError,
        state_error,
    )
    from keyedstate.functions import (
        AggregateFunction,
        CheckpointedFunction,
        FilterFunction,
        FlatMapFunction,
        Function,
        FunctionInitializationContext,
        FunctionSnapshotContext,
        KeyedProcessFunction,
        KeyedStateStore,
        MapFunction,
        OperatorStateStore,
        OutputTag,
        ReduceFunction,
        RichFilterFunction,
        RichFlatMapFunction,
        RichFunction,
        RichMapFunction,
        RuntimeContext,
        TimeDomain,
        TimerService,
    )
    from keyedstate.keyed_stream import (
        KeyedStream,
        key_by,
        side_output,
    )
    from keyedstate.offline.inspection import (
        InspectReport,
        inspect,
    )
    from keyedstate.offline.rescale import (
        RescaleResult,
        rescale,
    )
    from keyedstate.offline.savepoints import (
        RestoreResult,
        SavepointInfo,
        SavepointOperator,
        SavepointTable,
        dispose_savepoint,
        inspect_savepoint,
        list_savepoints,
        restore_savepoint,
        savepoint,
        stop_with_savepoint,
    )
    from keyedstate.runtime import (
        CheckpointConfig,
        CheckpointTimeoutError,
        ExternalizedCheckpointCleanup,
        QueryFailedError,
        RestartStrategies,
        RestartStrategy,
        Supervisor,
        SupervisorListener,
        SuppressRestartsException,
        exponential_delay_restart,
        failure_rate_restart,
        fixed_delay_restart,
        no_restart,
        run,
    )
    from keyedstate.state import (
        AggregatingState,
        AggregatingStateDescriptor,
        AppendingState,
        Duration,
        ListState,
        ListStateDescriptor,
        MapState,
        MapStateDescriptor,
        MergingState,
        ReducingState,
        ReducingStateDescriptor,
        State,
        StateDescriptor,
        StateTtlConfig,
        StateTypeError,
        StateUsageError,
        Time,
        TypeInformation,
        Types,
        ValueState,
        ValueStateDescriptor,
    )

# Where each name of the facade lives (the same names as ``__all__`` and the imports above).
_EXPORTS: dict[str, tuple[str, ...]] = {
    "keyedstate._session": (
        "OPTION_PREFIX",
        "PROVIDER_CLASS",
        "configure",
        "jar_path",
    ),
    "keyedstate.errors": (
        "CheckpointError",
        "CheckpointOperationError",
        "InvalidOptionError",
        "KeyedFunctionError",
        "KeyedStateError",
        "LocalDiskError",
        "QueryCheckpointError",
        "RescaleError",
        "StateSchemaError",
        "StateStoreError",
        "state_error",
    ),
    "keyedstate.functions": (
        "AggregateFunction",
        "CheckpointedFunction",
        "FilterFunction",
        "FlatMapFunction",
        "Function",
        "FunctionInitializationContext",
        "FunctionSnapshotContext",
        "KeyedProcessFunction",
        "KeyedStateStore",
        "MapFunction",
        "OperatorStateStore",
        "OutputTag",
        "ReduceFunction",
        "RichFilterFunction",
        "RichFlatMapFunction",
        "RichFunction",
        "RichMapFunction",
        "RuntimeContext",
        "TimeDomain",
        "TimerService",
    ),
    "keyedstate.keyed_stream": (
        "KeyedStream",
        "key_by",
        "side_output",
    ),
    "keyedstate.offline.inspection": (
        "InspectReport",
        "inspect",
    ),
    "keyedstate.offline.rescale": (
        "RescaleResult",
        "rescale",
    ),
    "keyedstate.offline.savepoints": (
        "RestoreResult",
        "SavepointInfo",
        "SavepointOperator",
        "SavepointTable",
        "dispose_savepoint",
        "inspect_savepoint",
        "list_savepoints",
        "restore_savepoint",
        "savepoint",
        "stop_with_savepoint",
    ),
    "keyedstate.runtime": (
        "CheckpointConfig",
        "CheckpointTimeoutError",
        "ExternalizedCheckpointCleanup",
        "QueryFailedError",
        "RestartStrategies",
        "RestartStrategy",
        "Supervisor",
        "SupervisorListener",
        "SuppressRestartsException",
        "exponential_delay_restart",
        "failure_rate_restart",
        "fixed_delay_restart",
        "no_restart",
        "run",
    ),
    "keyedstate.state": (
        "AggregatingState",
        "AggregatingStateDescriptor",
        "AppendingState",
        "Duration",
        "ListState",
        "ListStateDescriptor",
        "MapState",
        "MapStateDescriptor",
        "MergingState",
        "ReducingState",
        "ReducingStateDescriptor",
        "State",
        "StateDescriptor",
        "StateTtlConfig",
        "StateTypeError",
        "StateUsageError",
        "Time",
        "TypeInformation",
        "Types",
        "ValueState",
        "ValueStateDescriptor",
    ),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}
# The subpackages and modules reachable as attributes (``keyedstate.sinks.kafka(...)`` after a
# bare ``import keyedstate``), imported when first used.
_SUBMODULES = frozenset(
    {
        "elements",
        "engine",
        "errors",
        "examples",
        "functions",
        "keyed_stream",
        "offline",
        "runtime",
        "sinks",
        "state",
        "tools",
    }
)

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:  # noqa: ANN401 - the attribute asked for
    module = _MODULE_OF.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value  # later lookups find it without this function
        return value
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__) | _SUBMODULES)


__all__ = [
    "OPTION_PREFIX",
    "PROVIDER_CLASS",
    "configure",
    "jar_path",
    "CheckpointError",
    "CheckpointOperationError",
    "InvalidOptionError",
    "KeyedFunctionError",
    "KeyedStateError",
    "LocalDiskError",
    "QueryCheckpointError",
    "RescaleError",
    "StateSchemaError",
    "StateStoreError",
    "state_error",
    "AggregateFunction",
    "CheckpointedFunction",
    "FilterFunction",
    "FlatMapFunction",
    "Function",
    "FunctionInitializationContext",
    "FunctionSnapshotContext",
    "KeyedProcessFunction",
    "KeyedStateStore",
    "MapFunction",
    "OperatorStateStore",
    "OutputTag",
    "ReduceFunction",
    "RichFilterFunction",
    "RichFlatMapFunction",
    "RichFunction",
    "RichMapFunction",
    "RuntimeContext",
    "TimeDomain",
    "TimerService",
    "KeyedStream",
    "key_by",
    "side_output",
    "InspectReport",
    "inspect",
    "RescaleResult",
    "rescale",
    "RestoreResult",
    "SavepointInfo",
    "SavepointOperator",
    "SavepointTable",
    "dispose_savepoint",
    "inspect_savepoint",
    "list_savepoints",
    "restore_savepoint",
    "savepoint",
    "stop_with_savepoint",
    "CheckpointConfig",
    "CheckpointTimeoutError",
    "ExternalizedCheckpointCleanup",
    "QueryFailedError",
    "RestartStrategies",
    "RestartStrategy",
    "Supervisor",
    "SupervisorListener",
    "SuppressRestartsException",
    "exponential_delay_restart",
    "failure_rate_restart",
    "fixed_delay_restart",
    "no_restart",
    "run",
    "AggregatingState",
    "AggregatingStateDescriptor",
    "AppendingState",
    "Duration",
    "ListState",
    "ListStateDescriptor",
    "MapState",
    "MapStateDescriptor",
    "MergingState",
    "ReducingState",
    "ReducingStateDescriptor",
    "State",
    "StateDescriptor",
    "StateTtlConfig",
    "StateTypeError",
    "StateUsageError",
    "Time",
    "TypeInformation",
    "Types",
    "ValueState",
    "ValueStateDescriptor",
]
