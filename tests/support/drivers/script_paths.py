"""What a driver imports first when a test runs it as a script (``python3 <driver>.py``, so that
this folder, not the repository, is on ``sys.path``): the repository goes on the path, for
``tests.support``, and so does the package's folder (python/) unless keyedstate is installed."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))
if importlib.util.find_spec("keyedstate") is None:
    sys.path.insert(0, str(REPO / "python"))
