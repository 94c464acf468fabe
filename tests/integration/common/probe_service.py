"""A service with nothing but the shared runtime (InfoService, health, metrics, registration),
run as a real process by the integration tests: ``python probe_service.py --etcd ...``."""

import sys

from microco.services.common import run_service

if __name__ == "__main__":
    sys.exit(run_service("probe", "runtime probe for tests", setup=lambda ctx: None))
