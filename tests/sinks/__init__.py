"""The exactly-once sinks (``keyedstate.sinks``) and the end-to-end pipeline."""
