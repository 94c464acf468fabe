"""Schema-driven fuzzing of the console API in process (schemathesis against its own OpenAPI):
whatever the input, no 500, responses match the published schema, auth is never ignored."""

from __future__ import annotations

import pytest

schemathesis = pytest.importorskip(
    "schemathesis", reason="schemathesis is not installed (pip install schemathesis)"
)

import os

from hypothesis import HealthCheck, settings
from schemathesis.checks import ignored_auth, response_schema_conformance

from microco.common.kv import MemoryKV
from microco.services.console import DEFAULT_DEV_TOKEN, ConsoleConfig, create_app

app = create_app(ConsoleConfig(profile="dev"), MemoryKV(), start_recorder=False, use_redis=False)
# A generous read timeout (schemathesis's default is 10 s): the app runs in this process, and a
# machine busy with other work once took longer than 10 s to serve the schema at collection.
TIMEOUT_S = 120
schema = schemathesis.openapi.from_asgi("/api/v1/openapi.json", app, timeout=TIMEOUT_S)


# Fixed examples by default (CI must not fail at random); MICROCO_FUZZ_EXAMPLES=N explores afresh.
FUZZ_EXAMPLES = int(os.environ.get("MICROCO_FUZZ_EXAMPLES", "0"))


def no_internal_error(ctx, response, case):
    """A 500 is a console bug; 502/503 name a service that is down or failing, which is an answer."""
    assert response.status_code != 500, f"500 from {case.method} {case.path}: {response.text[:300]}"


@schema.parametrize()
@settings(
    max_examples=FUZZ_EXAMPLES or 4,
    derandomize=not FUZZ_EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    database=None,
)
def test_api_fuzz(case: schemathesis.Case) -> None:
    case.call_and_validate(
        headers={"Authorization": f"Bearer {DEFAULT_DEV_TOKEN}"},
        checks=[no_internal_error, response_schema_conformance, ignored_auth],
        timeout=TIMEOUT_S,
    )
