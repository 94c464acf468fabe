"""Errors never carry unbounded input back to a caller."""

from __future__ import annotations

from microco.common.errors import MAX_MESSAGE_CHARS, InvalidArgument, NotFound, bounded


def test_a_message_quoting_a_huge_value_is_cut_and_says_so():
    huge = "j" * 1_000_000
    err = NotFound(f"no job {huge}")
    assert len(str(err)) < MAX_MESSAGE_CHARS + 64
    assert str(err).startswith("no job jjj")
    assert str(err).endswith(f"({len('no job ') + len(huge) - MAX_MESSAGE_CHARS} more characters)")
    assert err.message == str(err)


def test_short_messages_are_untouched():
    assert str(InvalidArgument("devices must be >= 1")) == "devices must be >= 1"
    assert bounded("x" * MAX_MESSAGE_CHARS) == "x" * MAX_MESSAGE_CHARS
