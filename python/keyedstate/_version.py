"""keyedstate's version: the package's and its jar's (the facade's ``__version__``,
pyproject.toml and build.sbt say the same; tests/project/test_layout.py checks they agree)."""

__version__ = "0.1.0"
