"""The Python state API (``keyedstate.state``, ``functions``, ``keyed_stream``) on real queries."""
