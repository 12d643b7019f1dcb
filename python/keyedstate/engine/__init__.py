"""The engine under the state API: ``applyInPandasWithState`` over buckets of keys."""

from keyedstate.engine.operator import STATE_SCHEMA, BucketOperator, OperatorPlan
from keyedstate.engine.planner import DEFAULT_BUCKETS, build, output_struct, watermark_column

__all__ = [
    "DEFAULT_BUCKETS",
    "STATE_SCHEMA",
    "BucketOperator",
    "OperatorPlan",
    "build",
    "output_struct",
    "watermark_column",
]
