"""Operations on checkpoints and the demo: ``ops`` (rescale, inspect, read_state through the
JVM), ``cli`` (the ``keyedstate`` command), ``demo`` (``make demo``)."""
