"""scikit-learn's digits (1797 8x8 images), read straight from the file scikit-learn ships.

Importing ``sklearn.datasets`` costs ~2 s of imports (SciPy) per process; a scheduled job
restarts on every migration, so the examples read the same bundled CSV with NumPy alone.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path


def load_digits() -> tuple:
    """``(x, y)``: x float32 in [0, 1] of shape (1797, 64), y int64 labels."""
    import numpy as np

    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("scikit-learn is needed for the digits data: pip install scikit-learn")
    path = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
    data = np.loadtxt(path, delimiter=",")
    return (data[:, :-1] / 16.0).astype("float32"), data[:, -1].astype("int64")
