"""keyedstate: Flink-style keyed state for Spark Structured Streaming."""

from keyedstate._session import (
    OPTION_PREFIX,
    PROVIDER_CLASS,
    configure,
    jar_path,
)

__all__ = ["OPTION_PREFIX", "PROVIDER_CLASS", "configure", "jar_path"]
__version__ = "0.1.0"
