"""The state file `microco down`, `microco status` and the tests read while the supervisor
rewrites it: a reader sees the old file or the new one, never a half-written one (a truncated
read was seen failing the fault matrix with a JSONDecodeError)."""

from __future__ import annotations

import json

from microco.services.stack import Stack, StackOptions, read_state


def test_the_state_file_is_replaced_whole_never_rewritten_in_place(tmp_path):
    stack = Stack(StackOptions(home=tmp_path))
    stack._write_state()
    path = tmp_path / "stack.json"
    first = path.stat().st_ino
    stack._write_state()
    assert path.stat().st_ino != first  # a new file renamed over the old one
    assert read_state(tmp_path) == json.loads(path.read_text())
    assert [p.name for p in tmp_path.iterdir()] == ["stack.json"]  # no temporary left behind
