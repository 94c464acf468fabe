/* microco console plots: a few hand-written SVG charts, no dependencies, works offline.
 *
 *   MicrocoPlots.timeline(el, rows, opts)  rows: [{label, periods: [{state, start, end, migrated, node, devices}]}]
 *   MicrocoPlots.line(el, series, opts)    series: [{name, points: [[x, y, label, gap], ...]}]; a point
 *                                          with gap=true starts a new line (no line across missing data)
 *   MicrocoPlots.heatmap(el, rows, opts)   rows: [{label, values: [0..1 per slice]}], opts.start/bucketS
 *   MicrocoPlots.bar(el, value, max, opts) a single horizontal gauge
 */
(function (global) {
  "use strict";
  const NS = "http://www.w3.org/2000/svg";
  const STATE_COLORS = {
    queued: "#9aa5b1",
    running: "#2f9e44",
    packed: "#7048e8",
    suspended: "#f08c00",
    migrating: "#e03131",
    finished: "#1c7ed6",
    failed: "#c92a2a",
    cancelled: "#495057",
  };
  const PALETTE = ["#1c7ed6", "#2f9e44", "#f08c00", "#7048e8", "#e03131", "#0c8599", "#d6336c", "#5c940d"];

  function el(name, attrs, parent) {
    const node = document.createElementNS(NS, name);
    for (const k in attrs || {}) node.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(node);
    return node;
  }

  function text(parent, x, y, str, attrs) {
    const t = el("text", Object.assign({ x: x, y: y, "font-size": 11, fill: "#343a40" }, attrs || {}), parent);
    t.textContent = str;
    return t;
  }

  function svgFor(container, width, height) {
    container.innerHTML = "";
    return el("svg", { width: width, height: height, viewBox: `0 0 ${width} ${height}`, role: "img" }, container);
  }

  function niceTicks(min, max, count, integer) {
    if (!(max > min)) return [min];
    const span = max - min;
    const step0 = span / Math.max(1, count);
    const mag = Math.pow(10, Math.floor(Math.log10(step0)));
    const norm = step0 / mag;
    let step = (norm > 7 ? 10 : norm > 3 ? 5 : norm > 1.5 ? 2 : 1) * mag;
    if (integer) step = Math.max(1, Math.round(step)); // counts: whole ticks only
    const ticks = [];
    for (let v = Math.ceil(min / step) * step; v <= max + 1e-9; v += step) ticks.push(v);
    return ticks;
  }

  function fmtNum(v) {
    if (Math.abs(v) >= 1e9) return (v / 1e9).toFixed(1) + "G";
    if (Math.abs(v) >= 1e6) return (v / 1e6).toFixed(1) + "M";
    if (Math.abs(v) >= 1e3) return (v / 1e3).toFixed(1) + "k";
    if (Math.abs(v) < 10 && v !== Math.round(v)) return v.toFixed(2);
    return String(Math.round(v * 100) / 100);
  }

  function fmtClock(t) {
    const d = new Date(t * 1000);
    return d.toTimeString().slice(0, 8);
  }

  /* A device timeline: one row per job, one coloured bar per period, a red notch where the job
     resumed on other devices (migrated). */
  function timeline(container, rows, opts) {
    opts = opts || {};
    const width = opts.width || Math.max(480, (container.clientWidth || 814) - 14);
    const rowH = 22;
    const left = opts.labelWidth || 170;
    const top = 24;
    const height = top + rows.length * rowH + 34;
    const svg = svgFor(container, width, height);
    svg.setAttribute("class", "timeline");
    if (!rows.length) {
      text(svg, 10, 20, opts.empty || "nothing to show yet");
      return svg;
    }
    let t0 = Infinity;
    let t1 = -Infinity;
    rows.forEach((r) =>
      r.periods.forEach((p) => {
        t0 = Math.min(t0, p.start);
        t1 = Math.max(t1, p.end);
      })
    );
    if (!isFinite(t0)) {
      t0 = Date.now() / 1000 - 60;
      t1 = Date.now() / 1000;
    }
    if (opts.start !== undefined) t0 = opts.start; // a fixed time window (the window picker)
    if (opts.end !== undefined) t1 = opts.end;
    if (t1 - t0 < 10) t1 = t0 + 10;
    const plotW = width - left - 12;
    const x = (t) => left + ((t - t0) / (t1 - t0)) * plotW;
    niceTicks(0, t1 - t0, 6).forEach((dt) => {
      const xx = x(t0 + dt);
      el("line", { x1: xx, x2: xx, y1: top - 4, y2: height - 30, stroke: "#e9ecef" }, svg);
      text(svg, xx - 20, top - 8, fmtClock(t0 + dt), { "font-size": 10, fill: "#868e96" });
    });
    rows.forEach((r, i) => {
      const y = top + i * rowH;
      const g = el("g", { class: "timeline-row", "data-job-id": r.id || "" }, svg);
      const lbl = text(g, 4, y + 15, r.label.length > 26 ? r.label.slice(0, 25) + "…" : r.label);
      el("title", {}, lbl).textContent = r.label;
      r.periods.forEach((p) => {
        const x0 = x(p.start);
        const w = Math.max(2, x(p.end) - x0);
        const rect = el(
          "rect",
          {
            x: x0,
            y: y + 3,
            width: w,
            height: rowH - 6,
            rx: 3,
            fill: STATE_COLORS[p.state] || "#adb5bd",
            class: "period period-" + p.state,
            "data-state": p.state,
          },
          g
        );
        const title = el("title", {}, rect);
        title.textContent =
          (p.job_id ? `${p.job_id}${p.name ? " (" + p.name + ")" : ""}: ` : "") +
          `${p.state} ${fmtNum(p.end - p.start)}s` +
          (p.node ? ` on ${p.node}` : "") +
          (p.devices && p.devices.length ? ` [${p.devices.join(", ")}]` : "") +
          (p.migrated ? " (migrated here)" : "");
        if (p.migrated) {
          el("path", { d: `M${x0 - 4},${y} L${x0 + 4},${y} L${x0},${y + 7} Z`, fill: "#e03131", class: "migrated" }, g);
        }
      });
    });
    // legend
    let lx = left;
    const ly = height - 12;
    Object.keys(STATE_COLORS).forEach((s) => {
      el("rect", { x: lx, y: ly - 9, width: 10, height: 10, fill: STATE_COLORS[s], rx: 2 }, svg);
      text(svg, lx + 13, ly, s, { "font-size": 10 });
      lx += 14 + s.length * 6.2 + 10;
    });
    el("path", { d: `M${lx + 2},${ly - 9} L${lx + 10},${ly - 9} L${lx + 6},${ly - 2} Z`, fill: "#e03131" }, svg);
    text(svg, lx + 14, ly, "migrated", { "font-size": 10 });
    return svg;
  }

  /* Line chart with axes; x may be unix seconds (opts.time) or plain numbers. */
  function line(container, series, opts) {
    opts = opts || {};
    const width = opts.width || Math.max(320, (container.clientWidth || 494) - 14);
    const height = opts.height || 200;
    const m = { l: 52, r: 12, t: 18, b: 34 };
    const svg = svgFor(container, width, height);
    svg.setAttribute("class", "line-chart");
    const pts = series.flatMap((s) => s.points);
    if (!pts.length) {
      text(svg, 10, 20, opts.empty || "no samples yet");
      return svg;
    }
    let x0 = Math.min(...pts.map((p) => p[0]));
    let x1 = Math.max(...pts.map((p) => p[0]));
    let y0 = opts.yMin !== undefined ? opts.yMin : Math.min(0, ...pts.map((p) => p[1]));
    let y1 = opts.yMax !== undefined ? opts.yMax : Math.max(...pts.map((p) => p[1]));
    if (x1 === x0) x1 = x0 + 1;
    if (y1 === y0) y1 = y0 + 1;
    const X = (v) => m.l + ((v - x0) / (x1 - x0)) * (width - m.l - m.r);
    const Y = (v) => height - m.b - ((v - y0) / (y1 - y0)) * (height - m.t - m.b);
    niceTicks(y0, y1, 4, opts.integer).forEach((v) => {
      el("line", { x1: m.l, x2: width - m.r, y1: Y(v), y2: Y(v), stroke: "#e9ecef" }, svg);
      text(svg, 4, Y(v) + 4, opts.yFormat ? opts.yFormat(v) : fmtNum(v), { "font-size": 10, fill: "#868e96" });
    });
    niceTicks(opts.time ? 0 : x0, opts.time ? x1 - x0 : x1, 5).forEach((v) => {
      const xv = opts.time ? x0 + v : v;
      text(svg, X(xv) - (opts.time ? 22 : 14), height - m.b + 14, opts.time ? fmtClock(xv) : fmtNum(v), {
        "font-size": 10,
        fill: "#868e96",
      });
    });
    el("line", { x1: m.l, x2: m.l, y1: m.t, y2: height - m.b, stroke: "#adb5bd" }, svg);
    el("line", { x1: m.l, x2: width - m.r, y1: height - m.b, y2: height - m.b, stroke: "#adb5bd" }, svg);
    if (opts.xLabel) text(svg, width / 2 - 20, height - 4, opts.xLabel, { "font-size": 10 });
    if (opts.yLabel) text(svg, m.l + 4, m.t - 6, opts.yLabel, { "font-size": 10 });
    const legendWidth = series.reduce((w, s) => w + 22 + s.name.slice(0, 24).length * 6, 0);
    let legendX = Math.max(m.l + 90, width - m.r - legendWidth);
    series.forEach((s, i) => {
      const color = s.color || PALETTE[i % PALETTE.length];
      const sorted = s.points.slice().sort((a, b) => a[0] - b[0]);
      const pointsOnly = s.pointsOnly !== undefined ? s.pointsOnly : opts.pointsOnly;
      // one polyline per stretch without missing samples: never a line across a gap
      const segments = [];
      sorted.forEach((p, k) => {
        if (k === 0 || p[3] === true) segments.push([]);
        segments[segments.length - 1].push(p);
      });
      segments.forEach((seg) => {
        if (seg.length < 2 || pointsOnly) return;
        el(
          "polyline",
          {
            points: seg.map((p) => `${X(p[0]).toFixed(1)},${Y(p[1]).toFixed(1)}`).join(" "),
            fill: "none",
            stroke: color,
            "stroke-width": 1.8,
            class: "segment",
          },
          svg
        );
      });
      sorted.forEach((p) => {
        const c = el("circle", { cx: X(p[0]), cy: Y(p[1]), r: sorted.length > 60 ? 1.5 : 3, fill: color }, svg);
        const t = el("title", {}, c);
        t.textContent = `${s.name}: ${fmtNum(p[1])}` + (p[2] ? ` (${p[2]})` : "");
      });
      if (series.length > 1 || opts.legend) {
        // legend along the top, right-aligned so it never covers the y label
        const label = s.name.slice(0, 24);
        const lx = legendX;
        legendX += 22 + label.length * 6;
        el("rect", { x: lx, y: 4, width: 10, height: 4, fill: color }, svg);
        text(svg, lx + 14, 10, label, { "font-size": 10 });
      }
    });
    return svg;
  }

  /* Heatmap: one row per label, one cell per slice of the window, darker = busier (0..1). */
  function heatmap(container, rows, opts) {
    opts = opts || {};
    const width = opts.width || Math.max(480, (container.clientWidth || 814) - 14);
    const rowH = 18;
    const left = opts.labelWidth || 170;
    const top = 20;
    const height = top + rows.length * rowH + 30;
    const svg = svgFor(container, width, height);
    svg.setAttribute("class", "heatmap");
    if (!rows.length) {
      text(svg, 10, 20, opts.empty || "nothing to show yet");
      return svg;
    }
    const n = Math.max(...rows.map((r) => r.values.length));
    const cellW = (width - left - 12) / Math.max(1, n);
    const start = opts.start || 0;
    const bucketS = opts.bucketS || 1;
    niceTicks(0, n * bucketS, 6).forEach((dt) => {
      text(svg, left + (dt / bucketS) * cellW - 20, top - 6, fmtClock(start + dt), { "font-size": 10, fill: "#868e96" });
    });
    rows.forEach((r, i) => {
      const y = top + i * rowH;
      text(svg, 4, y + 13, r.label.length > 26 ? r.label.slice(0, 25) + "…" : r.label);
      r.values.forEach((v, k) => {
        const cell = el(
          "rect",
          { x: left + k * cellW, y: y + 1, width: Math.max(1, cellW - 1), height: rowH - 2, fill: "#2f9e44", "fill-opacity": 0.06 + 0.94 * v, class: "heat-cell" },
          svg
        );
        el("title", {}, cell).textContent = `${r.label} ${fmtClock(start + k * bucketS)}: ${Math.round(v * 100)}% busy`;
      });
    });
    const ly = height - 10;
    [0, 0.25, 0.5, 0.75, 1].forEach((v, k) => {
      el("rect", { x: left + k * 44, y: ly - 9, width: 12, height: 10, fill: "#2f9e44", "fill-opacity": 0.06 + 0.94 * v }, svg);
      text(svg, left + k * 44 + 15, ly, Math.round(v * 100) + "%", { "font-size": 10 });
    });
    text(svg, left + 5 * 44 + 4, ly, `busy per ${fmtNum(bucketS)} s slice`, { "font-size": 10, fill: "#868e96" });
    return svg;
  }

  function bar(container, value, max, opts) {
    opts = opts || {};
    const width = opts.width || 220;
    const svg = svgFor(container, width, 16);
    const frac = max > 0 ? Math.min(1, value / max) : 0;
    el("rect", { x: 0, y: 2, width: width, height: 12, rx: 3, fill: "#e9ecef" }, svg);
    el("rect", { x: 0, y: 2, width: width * frac, height: 12, rx: 3, fill: opts.color || "#1c7ed6" }, svg);
    text(svg, 4, 12, opts.label || Math.round(frac * 100) + "%", { "font-size": 10, fill: "#212529" });
    return svg;
  }

  global.MicrocoPlots = { timeline, line, bar, heatmap, STATE_COLORS, fmtNum, fmtClock };
})(window);
