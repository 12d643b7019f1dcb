"""Offline work on a checkpoint (``keyedstate.offline``): read, savepoints, transform,
bootstrap, rescale."""
