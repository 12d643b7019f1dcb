"""Offline operations on a query's checkpoint, through the JVM (``io.keyedstate.offline``):
``rescale``, ``inspection`` (``inspect``), ``reader`` (``keyedstate.state.read``) and
``savepoints``. Each runs as Spark jobs in the given session."""
