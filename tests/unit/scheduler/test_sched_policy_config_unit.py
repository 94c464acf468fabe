"""``--policy-config``: JSON text or a JSON file, clear errors otherwise."""

from __future__ import annotations

import pytest

from microco.common.errors import InvalidArgument
from microco.services.scheduler._service import load_policy_config


def test_policy_config_from_text_or_file(tmp_path):
    assert load_policy_config('{"quantum_s": 5}') == {"quantum_s": 5}
    f = tmp_path / "gandiva.json"
    f.write_text('{"quantum_s": 7, "enable_packing": false}')
    assert load_policy_config(str(f)) == {"quantum_s": 7, "enable_packing": False}
    assert load_policy_config(f"@{f}") == {"quantum_s": 7, "enable_packing": False}


@pytest.mark.parametrize(
    "value,needle",
    [
        ("@/no/such/file.json", "cannot read policy config file"),
        ("quantum_s=5", "is not JSON (nor a file that exists)"),
        ("[1, 2]", "must be a JSON object"),
    ],
)
def test_bad_policy_config_says_what_is_wrong(value, needle, tmp_path):
    with pytest.raises(InvalidArgument, match=needle.replace("(", r"\(").replace(")", r"\)")):
        load_policy_config(value)


def test_a_file_that_is_not_json_is_named(tmp_path):
    f = tmp_path / "bad.json"
    f.write_text("quantum_s: 5")
    with pytest.raises(InvalidArgument, match=f"policy config file {f} is not JSON"):
        load_policy_config(str(f))
