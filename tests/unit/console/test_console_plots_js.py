"""The page's plots (``static/plots.js``) run under node with a minimal DOM: a line is broken
where the API marked a gap (never drawn across missing samples), count axes get whole ticks, and
the heatmap has one cell per device and slice. Skipped, saying why, when node is not installed."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from microco.services.console import STATIC_DIR

NODE = shutil.which("node")
pytestmark = pytest.mark.skipif(NODE is None, reason="node is not installed (the page's plots run in it)")

DOM = """
class Node_ {
  constructor(name) { this.name = name; this.attrs = {}; this.children = []; this.textContent = ""; }
  setAttribute(k, v) { this.attrs[k] = String(v); }
  appendChild(c) { this.children.push(c); return c; }
  set innerHTML(v) { this.children = []; }
  all(name) { const out = []; const walk = (n) => { if (n.name === name) out.push(n); n.children.forEach(walk); }; walk(this); return out; }
}
global.window = global;
global.document = { createElementNS: (ns, name) => new Node_(name) };
global.makeContainer = () => Object.assign(new Node_("div"), { clientWidth: 800 });
"""


def _run(script: str) -> dict:
    code = DOM + (STATIC_DIR / "plots.js").read_text() + "\n" + script
    out = subprocess.run([NODE, "-e", code], check=False, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_line_breaks_at_a_marked_gap() -> None:
    got = _run("""
      const c = makeContainer();
      MicrocoPlots.line(c, [{ name: "s", points: [[0, 1], [2, 2], [4, 3, undefined, true], [6, 4], [8, 5]] }], { time: true });
      const lines = c.all("polyline").map((p) => p.attrs.points.split(" ").length);
      const c2 = makeContainer();
      MicrocoPlots.line(c2, [{ name: "s", points: [[0, 1], [2, 2], [4, 3], [6, 4]] }], {});
      console.log(JSON.stringify({ broken: lines, whole: c2.all("polyline").map((p) => p.attrs.points.split(" ").length) }));
    """)
    assert got == {"broken": [2, 3], "whole": [4]}


def test_count_axes_have_whole_ticks() -> None:
    got = _run("""
      const c = makeContainer();
      MicrocoPlots.line(c, [{ name: "n", points: [[0, 0], [1, 1], [2, 2]] }], { integer: true, yLabel: "extents" });
      const yTicks = c.all("text").filter((t) => t.attrs.x === "4").map((t) => t.textContent);
      const c2 = makeContainer();
      MicrocoPlots.line(c2, [{ name: "n", points: [[0, 0], [1, 1], [2, 2]] }], {});
      const plain = c2.all("text").filter((t) => t.attrs.x === "4").map((t) => t.textContent);
      console.log(JSON.stringify({ yTicks, plain, all: c.all("text").map((t) => t.textContent) }));
    """)
    assert got["yTicks"] == ["0", "1", "2"]
    assert any("." in t for t in got["plain"])  # without integer: fractional ticks (0.50, ...)
    assert "extents" in got["all"]


def test_the_heatmap_has_a_cell_per_device_and_slice() -> None:
    got = _run("""
      const c = makeContainer();
      MicrocoPlots.heatmap(c, [{ label: "n1/0", values: [0, 0.5, 1] }, { label: "n1/1", values: [1, 1, 0] }], { start: 0, bucketS: 60 });
      const cells = c.all("rect").filter((r) => r.attrs.class === "heat-cell");
      console.log(JSON.stringify({ n: cells.length, opacity: cells.slice(0, 3).map((r) => Number(r.attrs["fill-opacity"])) }));
    """)
    assert got["n"] == 6
    assert got["opacity"][0] < got["opacity"][1] < got["opacity"][2] == 1.0
