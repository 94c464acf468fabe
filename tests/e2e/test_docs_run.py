"""Docs that run: every ```bash block of README.md and docs/*.md is executed as a new user would
type it, so a drifting doc fails the suite.

Convention (also in docs/first-job.md, "Docs that run"):

* a document's runnable blocks run in order in one ``bash -euo pipefail`` session (a variable set
  in one block is there in the next), from the repository root;
* with a fresh ``HOME`` (so ``~/.microco`` is new and no developer state leaks in), no
  ``MICROCO_ETCD`` / ``MICROCO_REDIS`` / ``MICROCO_HOME``, the platform's ``microco`` and
  ``python`` first on ``PATH`` (what "``.venv/bin`` on your PATH" gives), and the console on a
  port of its own choosing (``MICROCO_CONSOLE_PORT=0``, so a console already on 8080 does not
  collide);
* a document that starts the platform must stop it (a stack left running fails the test);
* a block is skipped only when the line before its fence (blank lines aside) is
  ``<!-- docs-test: skip (why) -->`` with a reason: for what needs a GPU, Docker, the network
  or minutes.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SKIP = re.compile(r"<!--\s*docs-test:\s*skip\s*\((?P<why>[^)]*\S[^)]*)\)\s*-->")
MARKER = re.compile(r"<!--\s*docs-test:")
FENCE = re.compile(r"^(?P<indent>\s*)(?P<ticks>`{3,})(?P<lang>[\w+-]*)\s*$")
DOC_TIMEOUT_S = 900


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    code: str
    skip: str  # the reason, "" when it runs


def bash_blocks(path: Path, text: str | None = None) -> list[Block]:
    """The ```bash blocks of a Markdown file, each with its skip reason (if marked)."""
    lines = (path.read_text() if text is None else text).splitlines()
    out: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        ticks, lang, start = m.group("ticks"), m.group("lang"), i
        j = i + 1
        while j < len(lines) and not re.match(rf"^\s*{ticks}\s*$", lines[j]):
            j += 1
        if lang in ("bash", "sh", "shell", "console"):
            if lang != "bash":
                raise AssertionError(f"{path}:{start + 1}: use ```bash for commands (got ```{lang})")
            k = start - 1
            while k >= 0 and not lines[k].strip():
                k -= 1
            before = lines[k] if k >= 0 else ""
            skip = SKIP.search(before)
            if MARKER.search(before) and not skip:
                raise AssertionError(f"{path}:{k + 1}: a docs-test marker needs a reason: {before.strip()}")
            out.append(
                Block(
                    path,
                    start + 1,
                    "\n".join(lines[start + 1 : j]),
                    skip.group("why").strip() if skip else "",
                )
            )
        i = j + 1
    return out


# -- the convention itself (fast) ----------------------------------------------------------


def test_blocks_and_markers_are_read_as_documented() -> None:
    text = "\n".join(
        [
            "```bash",
            "echo one",
            "```",
            "<!-- docs-test: skip (needs a GPU) -->",
            "",
            "```bash",
            "nvidia-smi",
            "```",
            "```python",
            "print('not a command block')",
            "```",
            "````bash",
            "echo '```'",
            "````",
        ]
    )
    blocks = bash_blocks(Path("x.md"), text)
    assert [(b.line, b.code, b.skip) for b in blocks] == [
        (1, "echo one", ""),
        (6, "nvidia-smi", "needs a GPU"),
        (12, "echo '```'", ""),
    ]


def test_a_marker_without_a_reason_is_refused() -> None:
    with pytest.raises(AssertionError, match="needs a reason"):
        bash_blocks(Path("x.md"), "<!-- docs-test: skip -->\n```bash\nls\n```")


def test_every_doc_parses_and_every_skip_has_a_reason() -> None:
    blocks = [b for doc in DOCS for b in bash_blocks(doc)]
    assert any(b.path.name == "README.md" and not b.skip for b in blocks)
    assert any(b.path.name == "first-job.md" and not b.skip for b in blocks)
    assert all(b.skip.strip() for b in blocks if b.skip)


# -- running them (a stack per document: slow) ---------------------------------------------


def _runnable_docs() -> list[Path]:
    return [doc for doc in DOCS if any(not b.skip for b in bash_blocks(doc))]


def _script(doc: Path) -> str:
    parts = ["set -euo pipefail"]
    for b in bash_blocks(doc):
        if b.skip:
            continue
        where = f"{doc.relative_to(REPO)}:{b.line}"
        parts.append(f'echo ">>> {where} (at $SECONDS s)" >&2')
        parts.append(b.code)
    return "\n".join(parts) + "\n"


def _user_env(tmp: Path) -> dict[str, str]:
    shims = tmp / "bin"
    shims.mkdir()
    # `microco` and `python` as `.venv/bin` on PATH gives them: this interpreter, this tree
    (shims / "microco").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m microco.cli "$@"\n')
    (shims / "microco").chmod(0o755)
    for name in ("python", "python3"):
        (shims / name).write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
        (shims / name).chmod(0o755)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("MICROCO_ETCD", "MICROCO_REDIS", "MICROCO_HOME", "MICROCO_CONSOLE_TOKEN")
    }
    home = tmp / "home"
    home.mkdir()
    env.update(
        HOME=str(home),
        PATH=os.pathsep.join([str(shims), os.path.dirname(sys.executable), env.get("PATH", "")]),
        # 0: the console binds a free port itself. A port picked here and bound by the console
        # seconds later could be taken meanwhile (a parallel test's stack binds and connects
        # from ephemeral ports); `microco console open` reads where it listens from the stack.
        MICROCO_CONSOLE_PORT="0",
    )
    return env


def _troubles(logs: Path, most: int = 30) -> str:
    """The lines of the platform's logs that say what went wrong (short lines first in a
    failure's message: a CI summary keeps only the start of long ones)."""
    bad = re.compile(r"exited|error|Error|Traceback|not healthy|giving up|refused|in use")
    lines = [
        f"{log.name}: {line.strip()[:300]}"
        for log in sorted(logs.glob("*.log"))
        for line in log.read_text(errors="replace").splitlines()
        if bad.search(line)
    ]
    return "\n".join(lines[-most:]) or f"(nothing in {logs})"


@pytest.mark.e2e
@pytest.mark.slow  # a platform brought up and down per document, and real training jobs
@pytest.mark.parametrize("doc", _runnable_docs(), ids=lambda p: str(p.relative_to(REPO)))
def test_doc_commands_run(doc: Path, tmp_path: Path) -> None:
    env = _user_env(tmp_path)
    stack = Path(env["HOME"]) / ".microco" / "stack.json"
    try:
        proc = subprocess.run(
            ["bash", "-c", _script(doc)],
            cwd=REPO,
            env=env,
            check=False,
            capture_output=True,
            text=True,
            timeout=DOC_TIMEOUT_S,
        )
        said = f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-6000:]}"
        assert proc.returncode == 0, (
            f"{doc.name}: a command failed (exit {proc.returncode})\n"
            f"--- what the platform's logs say went wrong\n{_troubles(stack.parent / 'logs')}\n{said}"
        )
        assert "Traceback" not in proc.stdout + proc.stderr, said
        assert not stack.exists(), f"{doc.name} left the platform running (no `microco down`)"
    finally:
        if stack.exists():
            subprocess.run(
                [sys.executable, "-m", "microco.cli", "down", "--home", str(stack.parent)],
                env=env,
                check=False,
                capture_output=True,
                timeout=120,
            )
