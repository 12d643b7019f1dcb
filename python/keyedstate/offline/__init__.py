"""Offline operations on a query's checkpoint and savepoints (docs/state-processor.md,
docs/savepoints.md). Through the JVM (``io.keyedstate.offline``), each as Spark jobs in the
given session: ``rescale``, ``inspection`` (``inspect``), ``savepoints``, and the state
processor's ``reader`` (``keyedstate.state.read``), ``bootstrap`` and ``transform``. Without
Spark or a JVM: ``local_reader`` reads one state partition with rocksdict (``local_changelog``
replays keyedstate's changelogs, ``unsafe_row`` decodes Spark's rows)."""
