"""keyedstate's Python tests, one folder per layer of the code they test (docs/testing.md); what
they share is in ``tests.support``. Imported as ``tests.<folder>.<module>``."""
