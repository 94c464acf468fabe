"""microco: one import root assembled from the repository's top-level folders.

In a checkout the code lives where the architecture puts it (``protos/microco/api``,
``services/<system>``, ``clients``, ``benchmarks``, ``examples``); installed from a wheel the
same folders sit inside this package. Either way they import as ``microco.api``,
``microco.services``, ``microco.clients``, ``microco.benchmarks`` and ``microco.examples``.
See docs/layout.md.
"""

from __future__ import annotations

from pathlib import Path as _Path

__version__ = "0.1.0"

_here = _Path(__file__).resolve().parent
if _here.parent.name == "protos" and (_here.parent.parent / "services").is_dir():
    # Editable checkout: the repository root holds services/, clients/, ... beside protos/.
    __path__.append(str(_here.parent.parent))  # noqa: F821 - __path__ is set for packages
