"""Running streaming queries as Flink runs jobs: restart strategies, checkpoint settings and the
supervisor that applies them (docs/exactly-once.md, "Restart strategies" and "Checkpoint
settings"). Nothing here is imported by the public state API or the engine."""

from keyedstate.runtime.checkpoint_config import CheckpointConfig, ExternalizedCheckpointCleanup
from keyedstate.runtime.failures import (
    CheckpointTimeoutError,
    QueryFailedError,
    SuppressRestartsException,
)
from keyedstate.runtime.listener import SupervisorListener
from keyedstate.runtime.restart import (
    RestartStrategies,
    RestartStrategy,
    exponential_delay_restart,
    failure_rate_restart,
    fixed_delay_restart,
    no_restart,
)
from keyedstate.runtime.supervisor import Supervisor, run

__all__ = [
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
]
