/* microco console page: signs in with a token, polls the REST API, draws tables and plots.
 * All text from the API goes in through textContent (never innerHTML): names are user input. */
(function () {
  "use strict";
  const P = window.MicrocoPlots;
  const TOKEN_KEY = "microco-console-token";
  const REFRESH_MS = 2000;
  let token = sessionStorage.getItem(TOKEN_KEY) || "";
  let role = "";
  let tab = (location.hash || "#services").slice(1);
  let selectedJob = "";
  let schedulerInfo = null; // leader and policy (ListNodes), read once per page load
  let timer = null;
  let queryEdited = false;
  const WINDOW_KEY = "microco-console-window";

  // the time window the plots show (seconds back from now), kept across visits
  function win() {
    return Number($("window").value) || 3600;
  }

  const $ = (id) => document.getElementById(id);

  function h(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const k in attrs || {}) {
      if (k === "class") node.className = attrs[k];
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), attrs[k]);
      else node.setAttribute(k, attrs[k]);
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined) continue;
      node.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }

  async function api(path, options) {
    options = options || {};
    const headers = Object.assign({ Authorization: "Bearer " + token }, options.headers || {});
    if (options.body) headers["Content-Type"] = "application/json";
    const resp = await fetch("/api/v1" + path, Object.assign({}, options, { headers }));
    let body = null;
    try {
      body = await resp.json();
    } catch (e) {
      body = null;
    }
    if (resp.status === 401) {
      signOut("the token was refused");
      throw new Error("unauthenticated");
    }
    if (!resp.ok) {
      const msg = body && (body.message || JSON.stringify(body.detail)) ? body.message || JSON.stringify(body.detail) : resp.statusText;
      throw new Error(msg);
    }
    return body;
  }

  function fill(tbody, rows) {
    tbody.replaceChildren(...rows);
  }

  function unavailable(id, data, bodyId) {
    const note = $(id);
    const off = data && data.available === false;
    note.hidden = !off;
    note.textContent = off ? data.reason : "";
    if (bodyId) $(bodyId).hidden = off;
    return off;
  }

  function ago(seconds) {
    if (!seconds) return "";
    if (seconds < 90) return Math.round(seconds) + "s";
    if (seconds < 5400) return Math.round(seconds / 60) + "m";
    return (seconds / 3600).toFixed(1) + "h";
  }

  function bytes(n) {
    n = Number(n || 0);
    if (n >= 1 << 30) return (n / (1 << 30)).toFixed(1) + " GiB";
    if (n >= 1 << 20) return (n / (1 << 20)).toFixed(1) + " MiB";
    if (n >= 1 << 10) return (n / (1 << 10)).toFixed(1) + " KiB";
    return n + " B";
  }

  // Plots drawn before their card is in the page cannot measure themselves: size them from the tab.
  function plotWidth(container) {
    return Math.max(420, Math.min(1400, (container.clientWidth || 900) - 50));
  }

  function labels(obj) {
    return h("span", { class: "labels" }, Object.keys(obj || {}).map((k) => h("span", {}, k + "=" + obj[k])));
  }

  // ------------------------------------------------------------------ views
  async function showServices() {
    const [svc, sys] = await Promise.all([api("/services"), api("/systems")]);
    const healthy = svc.services.filter((s) => s.health === "SERVING").length;
    $("services-summary").textContent = `${healthy}/${svc.services.length} serving`;
    fill(
      $("services-table").tBodies[0],
      svc.services.map((s) =>
        h(
          "tr",
          { "data-service": s.name, "data-instance": s.instance_id },
          h("td", {}, s.name),
          h("td", { class: "mono" }, s.instance_id),
          h("td", { class: "mono" }, s.address),
          h("td", {}, h("span", { class: "health health-" + s.health }, s.health)),
          h("td", {}, ago(s.uptime_s)),
          h("td", {}, labels(s.labels))
        )
      )
    );
    fill(
      $("systems-table").tBodies[0],
      sys.systems.map((s) =>
        h("tr", {}, h("td", {}, s.name), h("td", {}, s.in_build ? "yes" : "no"), h("td", {}, s.running ? "yes" : "no"), h("td", {}, s.reason))
      )
    );
  }

  // "policy gandiva · leader scheduler-1a2b3c": which policy makes the decisions listed below
  async function showPolicy() {
    if (!schedulerInfo || !schedulerInfo.policy) {
      try {
        schedulerInfo = (await api("/nodes?limit=1")).scheduler || null;
      } catch (e) {
        schedulerInfo = null;
      }
    }
    const sch = schedulerInfo || {};
    const settings = Object.entries(sch.policy_settings || {}).map(([k, v]) => `${k} ${v}`).join(", ");
    $("jobs-policy").textContent = sch.policy
      ? `scheduling policy ${sch.policy}` + (settings ? ` (${settings})` : "") + (sch.leader ? ` · leader ${sch.leader}` : "")
      : "";
  }

  async function showJobs() {
    const data = await api("/jobs");
    if (unavailable("jobs-unavailable", data, "jobs-body")) return;
    showPolicy();
    const jobs = data.jobs;
    // the 30 most recent jobs (the list is newest first), drawn oldest at the top
    const rows = jobs
      .slice(0, 30)
      .reverse()
      .map((j) => ({ id: j.id, label: j.id, periods: j.timeline }));
    P.timeline($("jobs-timeline"), rows, { empty: "no jobs yet: submit one above" });
    fill(
      $("jobs-table").tBodies[0],
      jobs.map((j) => {
        const terminal = ["finished", "failed", "cancelled"].includes(j.state);
        const act = (label, fn, cls) =>
          h("button", { class: cls || "", "data-action": label, onclick: (ev) => { ev.stopPropagation(); fn(); } }, label);
        // Operator commands (what `microco job suspend|resume|migrate` does): the scheduler
        // checks each at once and the job carries it out at its next mini-batch boundary.
        const cancel =
          role === "admin" && !terminal
            ? h(
                "span",
                { class: "actions" },
                j.state === "running" ? act("suspend", () => controlJob(j.id, { action: "suspend" })) : "",
                j.state === "suspended" ? act("resume", () => controlJob(j.id, { action: "resume" })) : "",
                j.state === "running" ? act("migrate", () => migrateJob(j)) : "",
                act("cancel", () => cancelJob(j.id), "danger")
              )
            : "";
        return h(
          "tr",
          {
            class: "clickable" + (j.id === selectedJob ? " selected" : ""),
            "data-job-id": j.id,
            "data-state": j.state,
            onclick: () => { selectedJob = j.id; refresh(); },
          },
          h("td", { class: "mono" }, j.id),
          h("td", {}, (j.spec && j.spec.name) || ""),
          h("td", {}, h("span", { class: "state state-" + j.state }, j.state)),
          h("td", {}, j.node || ""),
          h("td", { class: "mono" }, (j.device_ids || []).join(", ")),
          h("td", {}, j.step || 0),
          h("td", {}, j.minibatch_ms ? Number(j.minibatch_ms).toFixed(1) : ""),
          h("td", {}, j.message || ""),
          h("td", {}, cancel)
        );
      })
    );
    if (selectedJob) {
      // the job across the systems (GET /jobs/{id}/links): its timeline and scheduler history,
      // its cache hits per dataset and the compiler graphs its training step ran under
      const links = await api("/jobs/" + encodeURIComponent(selectedJob) + "/links?window_s=" + win());
      const d = links.job;
      $("job-detail").hidden = false;
      P.timeline($("job-links-timeline"), [{ id: d.id, label: d.id, periods: d.timeline }], { empty: "no periods yet" });
      showJobCache(links.cache);
      showJobCompiler(links.compiler);
      $("job-detail-title").textContent = `${(d.spec && d.spec.name) || d.id} (${d.state})`;
      P.line($("job-steps"), [{ name: "step", points: d.progress.map((p) => [p.at, p.step, undefined, p.gap]) }], {
        time: true,
        xLabel: "time (clock)",
        yLabel: "steps",
        integer: true,
      });
      P.line(
        $("job-minibatch"),
        [{ name: "ms", points: d.progress.filter((p) => p.minibatch_ms > 0).map((p) => [p.at, p.minibatch_ms, undefined, p.gap]) }],
        { time: true, xLabel: "time (clock)", yLabel: "ms per mini-batch" }
      );
      // the scheduler's history of the job, newest first: every state change and each
      // mechanism decision (time-slice, pack, migrate, resize, profile) with its reason
      fill(
        $("job-decisions").tBodies[0],
        (d.history || [])
          .slice()
          .reverse()
          .map((e) =>
            h(
              "tr",
              { "data-state": e.state },
              h("td", { class: "mono", style: "white-space: nowrap" }, new Date(e.at * 1000).toLocaleTimeString()),
              h("td", {}, h("span", { class: "state state-" + e.state }, e.state)),
              h("td", {}, e.message || "")
            )
          )
      );
      showJobLog(selectedJob);
    } else {
      $("job-detail").hidden = true;
    }
  }

  // the selected job's cache hits, misses and bytes served per dataset (all cache servers summed)
  function showJobCache(c) {
    const note = $("job-cache-note");
    const table = $("job-cache");
    table.hidden = !c.available || !c.datasets.length;
    const pct = (r) => (r === null || r === undefined ? "" : Math.round(r * 100) + "%");
    if (!c.available) {
      note.textContent = c.reason;
      fill(table.tBodies[0], []);
      return;
    }
    const errors = (c.errors || []).map((e) => `${e.instance_id}: ${e.error}`);
    note.textContent =
      (c.datasets.length
        ? `${c.hits} hits, ${c.misses} misses (${pct(c.hit_rate)}), ${c.bytes_served} bytes served`
        : "no cache server has counted a lookup of this job") + (errors.length ? ` · not read: ${errors.join("; ")}` : "");
    fill(
      table.tBodies[0],
      c.datasets.map((ds) =>
        h(
          "tr",
          { "data-dataset": ds.dataset },
          h("td", { class: "mono" }, ds.dataset),
          h("td", {}, ds.hits),
          h("td", {}, ds.misses),
          h("td", {}, pct(ds.hit_rate)),
          h("td", {}, ds.bytes_served),
          h("td", { class: "mono" }, ds.servers.join(", "))
        )
      )
    );
  }

  // the compiler graphs the selected job registered, with their configuration and trials
  function showJobCompiler(c) {
    const box = $("job-compiler");
    if (!c.available) {
      box.replaceChildren(h("p", { class: "unavailable" }, c.reason));
      return;
    }
    if (!c.graphs.length) {
      box.replaceChildren(h("p", { class: "unavailable" }, "this job registered no compiler graph"));
      return;
    }
    box.replaceChildren(
      ...c.graphs.map((g) =>
        graphCard(
          g,
          box,
          h(
            "div",
            { class: "job-registration" },
            `registered by this job at ${new Date(g.job.registered_at * 1000).toLocaleTimeString()}` +
              (g.job.committed ? " · started from the committed configuration (no exploration)" : "")
          )
        )
      )
    );
  }

  // the last 200 lines of the selected job's output, from the node that keeps it
  async function showJobLog(id) {
    try {
      const log = await api("/jobs/" + encodeURIComponent(id) + "/log?tail=200");
      if (id !== selectedJob) return;
      if (!log.available) {
        $("job-log-title").textContent = "Output";
        $("job-log").textContent = log.reason;
        return;
      }
      const others = log.attempts.filter((a) => a !== log.attempt);
      $("job-log-title").textContent =
        `Output (attempt ${log.attempt} on ${log.node}` + (others.length ? `; also attempts ${others.join(", ")}` : "") + ", last 200 lines)";
      const pre = $("job-log");
      const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
      pre.textContent = log.text || "(nothing written yet)";
      if (atEnd) pre.scrollTop = pre.scrollHeight;
    } catch (e) {
      if (id !== selectedJob) return;
      $("job-log-title").textContent = "Output";
      $("job-log").textContent = e.message;
    }
  }

  async function controlJob(id, command) {
    try {
      await api("/jobs/" + encodeURIComponent(id) + "/control", {
        method: "POST",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify(command),
      });
    } catch (e) {
      status(command.action + " failed: " + e.message);
    }
    refresh();
  }

  function migrateJob(j) {
    const to = window.prompt(
      `Migrate ${j.id} to which devices? (node/index, comma-separated; ${(j.device_ids || []).length} wanted)`,
      ""
    );
    if (!to) return;
    const devices = to.split(",").map((d) => d.trim()).filter(Boolean);
    controlJob(j.id, { action: "migrate", devices });
  }

  async function cancelJob(id) {
    try {
      await api("/jobs/" + encodeURIComponent(id) + "/cancel", { method: "POST" });
    } catch (e) {
      status("cancel failed: " + e.message);
    }
    refresh();
  }

  async function submitJob(ev) {
    ev.preventDefault();
    const command = $("submit-command").value.trim().split(/\s+/).filter(Boolean);
    const body = {
      name: $("submit-name").value.trim(),
      command: command,
      devices: parseInt($("submit-devices").value, 10) || 1,
      elastic: $("submit-elastic").checked,
    };
    try {
      const job = await api("/jobs", { method: "POST", body: JSON.stringify(body) });
      $("submit-result").textContent = "submitted " + job.id;
      selectedJob = job.id;
    } catch (e) {
      $("submit-result").textContent = "refused: " + e.message;
    }
    refresh();
  }

  async function showDevices() {
    const dv = await api(`/devices?window_s=${win()}&buckets=60`);
    if (dv.available === false) {
      $("device-lanes").replaceChildren(h("p", { class: "unavailable" }, dv.reason));
      $("device-heatmap").replaceChildren();
      return;
    }
    P.timeline(
      $("device-lanes"),
      dv.lanes.map((l) => ({ id: l.device, label: l.device, periods: l.periods })),
      { start: dv.start, end: dv.end, empty: "no devices", width: plotWidth($("tab-nodes")) }
    );
    P.heatmap(
      $("device-heatmap"),
      dv.utilisation.map((u) => ({ label: u.device, values: u.busy })),
      { start: dv.start, bucketS: dv.bucket_s, empty: "no devices", width: plotWidth($("tab-nodes")) }
    );
  }

  async function showNodes() {
    await showDevices();
    const data = await api("/nodes");
    fill(
      $("nodes-table").tBodies[0],
      data.nodes.map((n) => {
        const i = n.info || {};
        const since = i.registered_at ? ago(Date.now() / 1000 - i.registered_at) + " ago" : "";
        return h(
          "tr",
          { "data-node": n.name },
          h("td", {}, n.name),
          h("td", { class: "mono" }, i.instance_id || ""),
          h("td", { class: "mono" }, i.address || ""),
          h("td", {}, Array.isArray(i.devices) ? i.devices.length : ""),
          h("td", {}, since),
          h("td", {}, labels(i.labels))
        );
      })
    );
    const sch = data.scheduler || {};
    if (sch.policy) schedulerInfo = sch;
    $("scheduler-summary").textContent = sch.leader ? `scheduler leader ${sch.leader} · policy ${sch.policy || "?"}` : "";
    $("devices-note").hidden = !data.devices_reason;
    $("devices-note").textContent = data.devices_reason || "";
    fill(
      $("devices-table").tBodies[0],
      data.devices.map((d) =>
        h(
          "tr",
          { "data-device": d.id },
          h("td", { class: "mono" }, d.id),
          h("td", {}, d.node),
          h("td", {}, d.kind),
          h("td", {}, d.model),
          h("td", {}, d.memory_bytes ? bytes(d.memory_bytes) : ""),
          h("td", {}, (d.jobs || []).map((j) => h("span", { class: "state state-" + j.state, title: j.state }, j.id)))
        )
      )
    );
  }

  async function showCache() {
    const data = await api("/cache?window_s=" + win());
    const box = $("cache-servers");
    if (unavailable("cache-unavailable", data)) {
      box.replaceChildren();
      return;
    }
    box.replaceChildren(
      ...data.servers.map((s) => {
        const st = s.stats || {};
        const gauge = h("div");
        P.bar(gauge, st.used_bytes || 0, st.capacity_bytes || 0, { label: `${bytes(st.used_bytes)} of ${bytes(st.capacity_bytes)}` });
        const plot = h("div", { class: "plot" });
        const card = h(
          "div",
          { class: "card cache-server" },
          h("h3", {}, `${s.instance_id} `, h("small", { class: "mono" }, s.address)),
          s.error ? h("p", { class: "error" }, s.error) : "",
          h("div", {}, `policy ${st.policy || "?"} · hits ${st.hits || 0} · misses ${st.misses || 0} · evictions ${st.evictions || 0} · corrupt dropped ${st.corrupt_dropped || 0}`),
          gauge,
          h("h4", {}, "Hit rate over time"),
          plot,
          h("h4", {}, "Allocations"),
          h(
            "table",
            { class: "grid" },
            h("thead", {}, h("tr", {}, ["dataset", "allocated", "used", "dataset size", "benefit s/GB", "jobs", "reason"].map((c) => h("th", {}, c)))),
            h(
              "tbody",
              {},
              (s.allocations || []).map((a) =>
                h(
                  "tr",
                  {},
                  h("td", { class: "mono" }, String(a.dataset || "").slice(0, 16)),
                  h("td", {}, bytes(a.bytes)),
                  h("td", {}, bytes(a.used_bytes)),
                  h("td", {}, bytes(a.dataset_bytes)),
                  h("td", {}, a.benefit_s_per_gb !== undefined ? Number(a.benefit_s_per_gb).toFixed(2) : ""),
                  h("td", {}, (a.jobs || []).join(", ")),
                  h("td", {}, a.reason || "")
                )
              )
            )
          ),
          h("h4", {}, "Datasets held"),
          h(
            "table",
            { class: "grid" },
            h("thead", {}, h("tr", {}, h("th", {}, "dataset"), h("th", {}, "bytes"), h("th", {}, "chunks"))),
            h("tbody", {}, (st.datasets || []).map((d) => h("tr", {}, h("td", { class: "mono" }, d.dataset), h("td", {}, bytes(d.bytes)), h("td", {}, d.chunks))))
          )
        );
        const perJob = Object.keys(s.job_hit_rate || {}).map((job) => ({
          name: job,
          points: s.job_hit_rate[job].map((p) => [p.at, p.hit_rate, undefined, p.gap]),
        }));
        const hitSeries = [{ name: "server", points: (s.hit_rate || []).map((p) => [p.at, p.hit_rate, undefined, p.gap]) }, ...perJob];
        P.line(plot, hitSeries, {
          width: plotWidth(box),
          legend: perJob.length > 0,
          time: true,
          yMin: 0,
          yMax: 1,
          yFormat: (v) => Math.round(v * 100) + "%",
          yLabel: "hit rate (%)",
          xLabel: "time (clock)",
          empty: "no lookups sampled yet",
        });
        if (!perJob.length) {
          plot.after(h("p", { class: "note" }, "Per-job hit rates appear when the cache server reports per-job counters."));
        }
        return card;
      })
    );
  }

  function partitioning(p) {
    if (!p) return "";
    return `${p.column} (${p.kind}${p.partitions ? ", " + p.partitions : ""})`;
  }

  async function showStore() {
    const data = await api("/store?window_s=" + win());
    if (unavailable("store-unavailable", data, "store-body")) return;
    // the example query names a table that exists here (until the operator edits it)
    if (!queryEdited && data.tables.length) {
      const names = data.tables.map((t) => t.name);
      let q = {};
      try {
        q = JSON.parse($("query-text").value);
      } catch (e) {
        q = {};
      }
      if (!names.includes(q.table)) $("query-text").value = JSON.stringify({ table: names[0], limit: 10 });
    }
    fill(
      $("store-tables").tBodies[0],
      data.tables.map((t) =>
        h(
          "tr",
          {},
          h("td", {}, t.name),
          h("td", {}, t.rows),
          h("td", {}, bytes(t.bytes)),
          [0, 1, 2].map((i) => h("td", {}, partitioning((t.replicas || [])[i])))
        )
      )
    );
    fill(
      $("store-nodes").tBodies[0],
      data.nodes.map((n) =>
        h(
          "tr",
          {},
          h("td", {}, n.name),
          h("td", {}, n.fault_domain),
          h("td", {}, h("span", { class: "health health-" + (n.alive ? "SERVING" : "UNREACHABLE") }, n.alive ? "alive" : "dead")),
          h("td", {}, bytes(n.bytes)),
          h("td", { class: "mono" }, n.flight_address)
        )
      )
    );
    const rec = $("store-recovery");
    if (!data.recovery) {
      rec.replaceChildren(h("p", { class: "unavailable" }, "recovery progress: not reported by this build of the store"));
    } else {
      const r = data.recovery;
      const lost = Number(r.lost_extents || 0);
      const rebuilt = Number(r.rebuilt || 0);
      const gauge = h("div");
      P.bar(gauge, rebuilt, lost, {
        width: 320,
        color: "#2f9e44",
        label: lost ? `${rebuilt} of ${lost} lost extents rebuilt` : "nothing lost",
      });
      const facts = [
        `state ${r.state || "idle"}`,
        `${r.unavailable_extents || 0} extents unavailable now`,
        r.bytes_lost ? `${bytes(r.bytes_read)} read for ${bytes(r.bytes_lost)} lost` : "",
        r.bytes_read_per_byte_lost ? `${Number(r.bytes_read_per_byte_lost).toFixed(2)} bytes read per byte lost` : "",
        r.seconds ? `${Number(r.seconds).toFixed(1)} s` : "",
      ].filter(Boolean);
      const plot = h("div", { class: "plot" });
      rec.replaceChildren(gauge, h("div", {}, facts.join(" · ")), plot);
      const hist = data.recovery_history || [];
      P.line(
        plot,
        [
          { name: "unavailable extents", points: hist.map((p) => [p.at, p.unavailable_extents || 0, undefined, p.gap]) },
          { name: "rebuilt", points: hist.map((p) => [p.at, p.rebuilt || 0, undefined, p.gap]) },
        ],
        { time: true, height: 160, legend: true, integer: true, yLabel: "extents", xLabel: "time (clock)", empty: "no recovery samples yet" }
      );
    }
  }

  async function runQuery(explainOnly) {
    let query;
    try {
      query = JSON.parse($("query-text").value);
    } catch (e) {
      $("query-status").textContent = "not JSON: " + e.message;
      return;
    }
    $("query-status").textContent = "running…";
    try {
      const r = await api("/store/query", { method: "POST", body: JSON.stringify({ query, explain_only: explainOnly, limit_rows: 200 }) });
      $("query-status").textContent = explainOnly
        ? `plan: ${r.plan_kind}`
        : `${r.row_count} rows${r.truncated ? " shown (the result has more)" : ""} · plan: ${r.plan_kind}`;
      $("query-explain-text").hidden = !r.explain;
      $("query-explain-text").textContent = r.explain || "";
      const table = $("query-result");
      table.tHead.replaceChildren(h("tr", {}, r.columns.map((c) => h("th", {}, c))));
      fill(table.tBodies[0], r.rows.map((row) => h("tr", {}, row.map((v) => h("td", {}, v === null ? "null" : String(v))))));
    } catch (e) {
      $("query-status").textContent = "refused: " + e.message;
    }
  }

  // one compiler graph: its exploration curve and its committed (or best so far) configuration;
  // `extra`: elements shown under the title (the Jobs tab says when the job registered it)
  function graphCard(g, box, extra) {
    const plot = h("div", { class: "plot" });
    const best = g.best && g.best.values ? g.best.values : {};
    const card = h(
      "div",
      { class: "card compiler-graph" },
      h("h3", {}, `${g.model_name || "graph"} `, h("small", { class: "mono" }, `${g.framework || ""} ${String(g.key).slice(0, 40)}`)),
      extra || null,
      h(
        "div",
        {},
        `${g.committed ? "committed" : "exploring"} · ${g.explore_steps || 0} exploration steps · first ${Number(g.first_step_ms).toFixed(2)} ms → best ${Number(g.best_step_ms).toFixed(2)} ms` +
          (g.speedup ? ` (${g.speedup.toFixed(2)}x)` : "")
      ),
      h("h4", {}, "Step time per trial"),
      plot,
      h("h4", {}, g.committed ? "Committed configuration" : "Best so far"),
      h("table", { class: "grid" }, h("tbody", {}, Object.keys(best).map((k) => h("tr", {}, h("td", {}, k), h("td", { class: "mono" }, best[k])))))
    );
    // one series per kind of trial (baseline, explore, compose, committed): the exploration curve
    const kinds = {};
    (g.trials || [])
      .filter((t) => t.step_ms > 0 && !t.failed)
      .forEach((t) => {
        const k = t.kind || "trial";
        (kinds[k] = kinds[k] || []).push([Number(t.trial), t.step_ms, JSON.stringify(t.values)]);
      });
    const all = Object.values(kinds).flat().sort((a, b) => a[0] - b[0]);
    let low = Infinity;
    const bestSoFar = all.map((p) => [p[0], (low = Math.min(low, p[1]))]);
    const series = Object.keys(kinds).map((k) => ({ name: k, points: kinds[k], pointsOnly: true }));
    // drawn first, so the measured points stay visible on top of it
    if (bestSoFar.length) series.unshift({ name: "best so far", points: bestSoFar, color: "#212529", pointsOnly: false });
    P.line(plot, series, {
      width: plotWidth(box),
      xLabel: "trial (number)",
      yLabel: "ms per step",
      legend: true,
      empty: "no trial measured yet",
    });
    return card;
  }

  async function showCompiler() {
    const data = await api("/compiler");
    const box = $("compiler-graphs");
    if (unavailable("compiler-unavailable", data)) {
      box.replaceChildren();
      return;
    }
    if (!data.graphs.length) {
      box.replaceChildren(h("p", { class: "unavailable" }, "no graphs registered yet"));
      return;
    }
    box.replaceChildren(...data.graphs.map((g) => graphCard(g, box)));
  }

  const VIEWS = { services: showServices, jobs: showJobs, nodes: showNodes, cache: showCache, store: showStore, compiler: showCompiler };

  // ------------------------------------------------------------------ shell
  function status(msg) {
    $("status-line").textContent = msg;
  }

  // A service that leaves the registry (a killed store node) is named in a banner on every tab,
  // rather than only turning 12/12 into 11/11.
  async function checkGone() {
    const svc = await api("/services?limit=1");
    const gone = svc.gone || [];
    const banner = $("gone-banner");
    banner.hidden = !gone.length;
    banner.textContent = gone.length
      ? "Gone from the registry: " +
        gone.map((g) => `${g.name} ${g.instance_id} (${g.address}) since ${P.fmtClock(g.gone_at)}`).join("; ")
      : "";
  }

  async function refresh() {
    if (!token) return;
    clearTimeout(timer);
    const view = VIEWS[tab] || showServices;
    try {
      await Promise.all([view(), checkGone()]);
      status("updated " + new Date().toTimeString().slice(0, 8));
    } catch (e) {
      if (e.message !== "unauthenticated") status("update failed: " + e.message);
    }
    if (token) timer = setTimeout(refresh, REFRESH_MS);
  }

  function showTab(name) {
    tab = VIEWS[name] ? name : "services";
    document.querySelectorAll("section.tab").forEach((s) => (s.hidden = s.id !== "tab-" + tab));
    document.querySelectorAll("#tabs a").forEach((a) => a.classList.toggle("active", a.dataset.tab === tab));
    refresh();
  }

  function signOut(reason) {
    token = "";
    sessionStorage.removeItem(TOKEN_KEY);
    clearTimeout(timer);
    $("login").hidden = false;
    $("login-error").textContent = reason || "";
  }

  async function signIn(candidate) {
    const resp = await fetch("/api/v1/whoami", { headers: { Authorization: "Bearer " + candidate } });
    if (!resp.ok) {
      $("login-error").textContent = resp.status === 401 ? "wrong token" : "console error " + resp.status;
      return false;
    }
    const me = await resp.json();
    token = candidate;
    role = me.role;
    sessionStorage.setItem(TOKEN_KEY, token);
    $("login").hidden = true;
    $("login-error").textContent = "";
    $("who").textContent = `${me.role} · ${me.profile} · ${me.instance_id}`;
    $("submit-form").hidden = role !== "admin";
    const banner = $("banner");
    banner.hidden = !me.default_token;
    banner.textContent = me.default_token ? "This console uses the default development token: fine on a laptop, never for a shared cluster." : "";
    showTab(tab);
    return true;
  }

  document.addEventListener("DOMContentLoaded", () => {
    $("login-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      signIn($("login-token").value.trim());
    });
    $("logout").addEventListener("click", () => signOut(""));
    $("submit-form").addEventListener("submit", submitJob);
    $("query-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      runQuery(false);
    });
    $("query-explain").addEventListener("click", () => runQuery(true));
    $("query-text").addEventListener("input", () => (queryEdited = true));
    const saved = localStorage.getItem(WINDOW_KEY);
    if (saved && [...$("window").options].some((o) => o.value === saved)) $("window").value = saved;
    $("window").addEventListener("change", () => {
      localStorage.setItem(WINDOW_KEY, $("window").value);
      refresh();
    });
    window.addEventListener("hashchange", () => showTab(location.hash.slice(1)));
    if (token) {
      signIn(token).then((ok) => { if (!ok) signOut(""); });
    } else {
      signOut("");
    }
  });
})();
