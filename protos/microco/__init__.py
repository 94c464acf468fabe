"""microco: one import root over the repository's top-level folders.

The code lives where the architecture puts it: ``protos/microco/api`` (the gRPC contracts and
their generated code), ``common/``, ``clients/``, ``services/``, ``cli/``, ``benchmarks/`` and
``examples/``. This package is their one import root: each of those folders is linked here by a
relative symbolic link (``protos/microco/services -> ../../services``), so ``microco.services``,
``microco.clients`` and the rest resolve from the checkout for Python, mypy, pyright and an IDE
alike, with ``protos/`` as the only path entry. A wheel carries the same folders as plain
directories. See docs/layout.md.
"""

from __future__ import annotations

__version__ = "0.1.0"
