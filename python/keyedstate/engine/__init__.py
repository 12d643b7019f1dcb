"""The engine under the state API: a per-key stateful operator (JVM lookup and apply nodes
around Spark's ``mapInArrow``) whose states are column families of the state store."""

from keyedstate.engine.planner import build, output_struct, watermark_column

__all__ = ["build", "output_struct", "watermark_column"]
