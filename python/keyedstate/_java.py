"""Java exceptions as py4j hands them over, read the same way wherever a JVM failure becomes a
Python error (the sinks, the operations tools, the restart strategies' failure classes)."""

from __future__ import annotations

from typing import Any

__all__ = ["MAX_CAUSES", "first_line", "java_causes"]

# Spark wraps a task's failure a few times; a longer chain is a cycle the JVM did not close.
MAX_CAUSES = 64


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
