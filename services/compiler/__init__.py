"""microco.services.compiler: Astra's compiler service.

A thin gRPC adapter (:mod:`._servicer`, run by ``python -m microco.services.compiler``) over
:class:`~microco.clients.compiler.explore.CompilerCore`, the exploration core it shares with the
training-side wrapper. The core lives one layer down, in :mod:`microco.clients.compiler.explore`:
import it from there.
"""

from ._servicer import add_arguments, setup

__all__ = ["add_arguments", "setup"]
