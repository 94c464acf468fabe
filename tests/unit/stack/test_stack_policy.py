"""``microco up --policy NAME --policy-config FILE``: the flags are checked before anything
starts, reach every scheduler of the stack, and the scheduler they start runs that policy."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from microco.cli import build_parser
from microco.cli._platform import stack_options
from microco.common.errors import InvalidArgument
from microco.common.kv import MemoryKV
from microco.services.scheduler import Scheduler, load_policy_config
from microco.services.scheduler._service import add_arguments
from microco.services.stack import platform_processes


def _up(tmp_path: Path, *flags: str) -> argparse.Namespace:
    return build_parser().parse_args(["up", "--home", str(tmp_path / "home"), *flags])


def _scheduler_from(spec_args: tuple[str, ...]) -> Scheduler:
    """The scheduler that ``python -m microco.services.scheduler <spec args>`` builds."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(list(spec_args))
    return Scheduler(MemoryKV(), "scheduler-test", args.policy, load_policy_config(args.policy_config))


def test_the_default_is_gandiva_with_its_own_settings(tmp_path: Path) -> None:
    opts = stack_options(_up(tmp_path))
    assert opts.policy == "gandiva" and opts.policy_config == {}
    sched = next(s for s in platform_processes(opts) if s.name == "scheduler")
    assert sched.args == ("--policy", "gandiva")


def test_policy_and_config_file_reach_leader_and_standby(tmp_path: Path) -> None:
    cfg = tmp_path / "las.json"
    cfg.write_text(json.dumps({"min_run_s": 7.5, "thresholds_s": [60.0]}))
    opts = stack_options(_up(tmp_path, "--policy", "las", "--policy-config", str(cfg)))
    specs = [s for s in platform_processes(opts) if s.service == "scheduler"]
    assert [s.name for s in specs] == ["scheduler", "scheduler-standby"]
    for spec in specs:
        sched = _scheduler_from(spec.args)
        try:
            assert sched.core.policy.name == "las"
            assert sched.core.policy.config.min_run_s == 7.5  # type: ignore[attr-defined]
            assert list(sched.core.policy.config.thresholds_s) == [60.0]  # type: ignore[attr-defined]
        finally:
            sched.core.agents.close()
    # The settings travel as JSON text: a restart does not need the file any more.
    cfg.unlink()
    assert _scheduler_from(specs[0].args).core.policy.name == "las"


def test_json_text_settings_are_passed_as_given(tmp_path: Path) -> None:
    opts = stack_options(_up(tmp_path, "--policy-config", '{"quantum_s": 10, "enable_packing": false}'))
    sched = _scheduler_from(next(s for s in platform_processes(opts) if s.name == "scheduler").args)
    try:
        assert sched.core.policy.name == "gandiva"
        assert sched.core.policy.config.quantum_s == 10  # type: ignore[attr-defined]
        assert sched.core.policy.config.enable_packing is False  # type: ignore[attr-defined]
    finally:
        sched.core.agents.close()


def test_an_unknown_policy_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Checked when the command line is read (the policy registry is loaded only then: simple
    commands start without it), so nothing starts."""
    with pytest.raises(SystemExit) as info:
        _up(tmp_path, "--policy", "tiresias")
    assert info.value.code == 2
    assert (
        "argument --policy: invalid choice: 'tiresias' (choose from fifo, gandiva, las)"
        in capsys.readouterr().err
    )
    assert not (tmp_path / "home").exists()


@pytest.mark.parametrize(
    "flags,needle",
    [
        (("--policy", "las", "--policy-config", '{"quantum_s": 5}'), "has no option"),
        (("--policy-config", '{"quantum_s": "ten"}'), "must be a number"),
        (("--policy-config", "quantum_s=5"), "not JSON"),
        (("--policy-config", "@/no/such/file.json"), "cannot read policy config file"),
    ],
)
def test_a_bad_policy_is_refused_before_anything_starts(tmp_path: Path, flags, needle) -> None:
    with pytest.raises(InvalidArgument, match=needle.replace("(", r"\(").replace(")", r"\)")):
        stack_options(_up(tmp_path, *flags))
    assert not (tmp_path / "home").exists()


def test_up_says_which_policy_runs() -> None:
    from microco.cli._platform import describe_policy

    assert describe_policy("gandiva", {}) == "gandiva (its defaults)"
    assert (
        describe_policy("las", {"min_run_s": 7.5, "allow_spread": False})
        == "las (allow_spread=no, min_run_s=7.5)"
    )


@pytest.mark.parametrize(
    "flags,preload", [((), "auto"), (("--preload", "none"), "none"), (("--preload", "numpy"), "numpy")]
)
def test_preload_reaches_the_node_agent(tmp_path: Path, flags: tuple[str, ...], preload: str) -> None:
    """``microco up --preload``: what the agent's warm zygote imports (none: no zygote)."""
    from microco.services.agent._service import add_arguments as agent_arguments

    agent = next(s for s in platform_processes(stack_options(_up(tmp_path, *flags))) if s.name == "agent")
    parser = argparse.ArgumentParser()
    agent_arguments(parser)
    assert parser.parse_known_args(list(agent.args))[0].preload == preload
