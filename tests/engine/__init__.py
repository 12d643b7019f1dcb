"""The per-key engine (``keyedstate.engine``) and the keyed functions' declaration it keeps."""
