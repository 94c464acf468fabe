"""The console refuses unsafe settings at start-up."""

import pytest

from microco.common.errors import InvalidArgument
from microco.services.console import DEFAULT_DEV_TOKEN, ConsoleConfig


def test_dev_profile_falls_back_to_the_default_token() -> None:
    cfg = ConsoleConfig(profile="dev")
    assert cfg.token == DEFAULT_DEV_TOKEN
    assert cfg.uses_default_token


def test_default_token_refused_outside_dev() -> None:
    with pytest.raises(InvalidArgument, match="default development token is refused"):
        ConsoleConfig(profile="prod", token=DEFAULT_DEV_TOKEN)


def test_missing_token_refused_outside_dev() -> None:
    with pytest.raises(InvalidArgument, match="admin token is required"):
        ConsoleConfig(profile="prod")


def test_short_token_refused_outside_dev() -> None:
    with pytest.raises(InvalidArgument, match="at least 16"):
        ConsoleConfig(profile="prod", token="short")


def test_prod_with_a_real_token() -> None:
    cfg = ConsoleConfig(profile="prod", token="a" * 32, view_token="b" * 32)
    assert not cfg.uses_default_token


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"profile": "staging"}, "profile"),
        ({"http_port": 70000}, "HTTP port"),
        ({"token": "same", "view_token": "same"}, "must differ"),
        ({"token": "has space"}, "whitespace"),
        ({"redis": "http://x"}, "redis URL"),
        ({"etcd": "nohostport"}, "etcd endpoint"),
        ({"rpc_timeout_s": 0}, "timeouts"),
    ],
)
def test_bad_settings_named_in_the_error(kwargs: dict, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        ConsoleConfig(**kwargs)


def test_flags_and_environment(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    import argparse

    from microco.services.console._config import add_console_flags, config_from_args
    from microco.services.runtime.settings import add_common_flags

    parser = argparse.ArgumentParser()
    add_common_flags(parser)
    add_console_flags(parser)
    token_file = tmp_path / "token"
    token_file.write_text("t" * 20 + "\n")
    args = parser.parse_args(
        ["--profile", "prod", "--token-file", str(token_file), "--http-port", "0", "--instance-id", "c1"]
    )
    cfg = config_from_args(args)
    assert cfg.token == "t" * 20 and cfg.instance_id == "c1" and cfg.http_port == 0

    monkeypatch.setenv("MICROCO_CONSOLE_TOKEN", DEFAULT_DEV_TOKEN)
    args = parser.parse_args(["--profile", "prod"])
    with pytest.raises(InvalidArgument, match="refused"):
        config_from_args(args)
