"""The console is never published on the well-known development token (issue 16): refused on a
non-loopback address unless explicitly allowed, warned about on every start when allowed, and the
compose and Kubernetes files run it with a token of its own."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from microco.common.errors import InvalidArgument
from microco.services.console import DEFAULT_DEV_TOKEN, ConsoleConfig

ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "", "10.1.2.3", "console.example.org"])
def test_the_dev_token_is_refused_on_a_published_address(host: str) -> None:
    with pytest.raises(InvalidArgument, match="refused on .*not a loopback address"):
        ConsoleConfig(profile="dev", host=host)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.53", "::1", "localhost"])
def test_the_dev_token_is_fine_on_loopback(host: str) -> None:
    cfg = ConsoleConfig(profile="dev", host=host)
    assert cfg.uses_default_token
    assert not any("INSECURE" in w for w in cfg.start_warnings())


def test_an_explicit_flag_allows_it_and_every_start_says_so() -> None:
    cfg = ConsoleConfig(profile="dev", host="0.0.0.0", insecure_dev_token=True)
    [warning] = cfg.start_warnings()
    assert "INSECURE" in warning and "0.0.0.0" in warning


def test_a_real_token_may_be_published() -> None:
    cfg = ConsoleConfig(profile="dev", host="0.0.0.0", token="t" * 32)
    assert cfg.start_warnings() == []


def _console(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MICROCO_")}
    return subprocess.run(
        [sys.executable, "-m", "microco.services.console", *args],
        check=False,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_process_refuses_to_start_published_on_the_dev_token() -> None:
    r = _console("--host", "0.0.0.0", "--http-port", "0", "--etcd", "127.0.0.1:9")
    assert r.returncode == 2
    assert "refused on 0.0.0.0" in r.stderr and "--insecure-dev-token" in r.stderr
    assert "Traceback" not in r.stderr


def test_the_flag_takes_effect_from_the_environment_too() -> None:
    import argparse

    from microco.services.console._config import INSECURE_ENV, add_console_flags, config_from_args
    from microco.services.runtime.settings import add_common_flags

    old = os.environ.get(INSECURE_ENV)
    os.environ[INSECURE_ENV] = "1"
    try:
        parser = argparse.ArgumentParser()
        add_common_flags(parser)
        add_console_flags(parser)
        cfg = config_from_args(parser.parse_args(["--host", "0.0.0.0", "--profile", "dev"]))
    finally:
        if old is None:
            os.environ.pop(INSECURE_ENV)
        else:
            os.environ[INSECURE_ENV] = old
    assert cfg.insecure_dev_token and "INSECURE" in cfg.start_warnings()[0]


def test_compose_publishes_the_console_only_with_a_token_of_its_own() -> None:
    doc = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    console = doc["services"]["console"]
    env = console["environment"]
    assert env["MICROCO_PROFILE"] == "prod"  # refuses the dev token and a missing one
    assert env["MICROCO_CONSOLE_TOKEN"].startswith("${MICROCO_CONSOLE_TOKEN:?")  # compose stops if unset
    assert DEFAULT_DEV_TOKEN not in yaml.safe_dump(doc)
    for port in console["ports"]:
        assert str(port).startswith("127.0.0.1:"), port


def test_kubernetes_runs_the_console_on_a_secret_token_under_prod() -> None:
    docs = list(yaml.safe_load_all((ROOT / "deploy/k8s/20-services.yaml").read_text()))
    env_map = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "microco-env")
    assert env_map["data"]["MICROCO_PROFILE"] == "prod"
    console = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "console")
    [container] = console["spec"]["template"]["spec"]["containers"]
    token = next(e for e in container["env"] if e["name"] == "MICROCO_CONSOLE_TOKEN")
    assert token["valueFrom"]["secretKeyRef"] == {"name": "microco-console", "key": "token"}
    assert (
        "kubectl -n microco create secret generic microco-console" in (ROOT / "docs/console.md").read_text()
    )
