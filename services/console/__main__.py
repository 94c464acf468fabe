"""``python -m microco.services.console``: run the admin console."""

import sys

from ._server import main

sys.exit(main())
