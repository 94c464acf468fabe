"""A service with nothing but the shared runtime (InfoService, health, metrics, registration),
run as a real process by the integration tests: ``python probe_service.py --etcd ...``.
``PROBE_SETUP_S``: seconds its setup takes (a start-up waiting on a dependency)."""

import os
import sys
import time

from microco.services.runtime import run_service


def setup(ctx):
    print("setting up", flush=True)
    time.sleep(float(os.environ.get("PROBE_SETUP_S", "0")))


if __name__ == "__main__":
    sys.exit(run_service("probe", "runtime probe for tests", setup=setup))
