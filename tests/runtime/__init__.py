"""The supervisor (``keyedstate.runtime``): restart strategies and checkpoint settings."""
