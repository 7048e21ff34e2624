// skyward dashboard: renders the pages from /api and keeps them current from /api/events (SSE).
// Plain browser JavaScript, no build step. Text from the API is always set as text (never as
// HTML), so nothing a pool or a program reports can inject markup.
"use strict";

const PAGE = document.body.dataset.page;
const REF = document.body.dataset.ref;
const POINTS = 300; // samples per chart

// -- small helpers --------------------------------------------------------------------------
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

// The session's key, kept by the login page in this origin's storage (the port is part of the
// origin: another server on another port of this host cannot read it). The session cookie alone
// opens no API call: a browser sends it to every port of the host.
const SESSION = localStorage.getItem("skyward-session") || "";

// A page's loader may be called again before its last answer came (live updates, a button):
// each call takes a ticket, and an answer whose ticket is no longer the newest is dropped, so a
// slow answer overtaken by a later one never paints the older state last.
function tickets() {
  let last = 0;
  return () => { const mine = ++last; return () => mine === last; };
}

async function api(path, options) {
  const opts = Object.assign({ credentials: "same-origin" }, options || {});
  opts.headers = Object.assign({ "X-Skyward-Session": SESSION, "Content-Type": "application/json" }, opts.headers || {});
  const response = await fetch(path, opts);
  let body = null;
  try { body = await response.json(); } catch (e) { body = null; }
  if (!response.ok) throw new Error((body && body.error) || `${response.status} ${response.statusText}`);
  return body;
}

function duration(seconds) {
  if (seconds === null || seconds === undefined) return "-";
  let s = Math.max(0, Math.floor(seconds));
  if (s < 120) return `${s}s`;
  if (s < 7200) return `${Math.floor(s / 60)}m`;
  if (s < 172800) return `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
  return `${Math.floor(s / 86400)}d`;
}
const money = (v) => (v === null || v === undefined ? "-" : `$${Number(v).toFixed(v < 1 ? 4 : 2)}`);
const when = (t) => (t ? new Date(t * 1000).toLocaleString() : "-");
const clock = (t) => (t ? new Date(t * 1000).toLocaleTimeString() : "-");
const pad2 = (n) => String(n).padStart(2, "0");
// A chart's time tick as a person reads it (14:45:10), not uPlot's default (":44.500").
const hms = (t) => { const d = new Date(t * 1000); return `${pad2(d.getHours())}:${pad2(d.getMinutes())}:${pad2(d.getSeconds())}`; };
const TICK_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 86400]; // whole seconds

function expiry(p) {
  if (p.ttl === 0) return "never";
  if (p.expires_in_seconds === null || p.expires_in_seconds === undefined) return p.kind === "program" ? "with its program" : "-";
  return p.expires_in_seconds <= 0 ? "now" : `in ${duration(p.expires_in_seconds)}`;
}

function badge(state) {
  return h("span", { class: `badge state-${String(state).replace(/\s+/g, "-")}` }, state);
}

function debounce(fn, ms) {
  let timer = null;
  return (...args) => {
    if (timer) return;
    timer = setTimeout(() => { timer = null; fn(...args); }, ms);
  };
}

function setMain(...children) {
  const main = document.getElementById("main");
  const flashes = [...main.querySelectorAll(":scope > .flash")]; // messages outlive a re-render
  main.replaceChildren(...flashes, ...children.filter((c) => c !== null && c !== undefined));
}

function flash(message, kind) {
  const box = h("div", { class: `flash ${kind || "error"}`, role: "alert" }, message);
  document.getElementById("main").prepend(box);
  setTimeout(() => box.remove(), 8000);
}

function confirmAction(text) {
  const dialog = document.getElementById("confirm");
  document.getElementById("confirm-text").textContent = text;
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(dialog.returnValue === "ok"), { once: true });
    dialog.showModal();
  });
}

function table(headers, rows, attrs) {
  return h("table", attrs || {},
    h("thead", {}, h("tr", {}, headers.map((x) => h("th", {}, x)))),
    h("tbody", {}, rows));
}

// -- live updates ---------------------------------------------------------------------------
function connect(pool, onMessages) {
  const status = document.getElementById("live-status");
  const url = `/api/events?session=${encodeURIComponent(SESSION)}` + (pool ? `&pool=${encodeURIComponent(pool)}` : "");
  const source = new EventSource(url);
  source.onopen = () => { status.textContent = "live"; status.className = "live"; };
  source.onerror = () => { status.textContent = "reconnecting"; status.className = "muted"; };
  source.onmessage = (e) => {
    try { onMessages(JSON.parse(e.data)); } catch (err) { console.error(err); }
  };
  return source;
}

// -- pools list -----------------------------------------------------------------------------
const poolsTicket = tickets();
async function renderPools() {
  const current = poolsTicket();
  let pools;
  try { pools = await api("/api/pools"); } catch (e) { if (current()) setMain(h("p", { class: "error" }, e.message)); return; }
  if (!current()) return;
  const rows = pools.map((p) => h("tr", { dataset: { ref: p.ref, state: p.state } },
    h("td", {}, h("a", { href: `/pools/${encodeURIComponent(p.ref)}` }, p.name || p.ref)),
    h("td", {}, p.kind === "named" ? "named" : `program ${p.program || ""} (pid ${p.pid})`),
    h("td", {}, badge(p.state)),
    h("td", {}, p.provider || "-"),
    h("td", { class: "num" }, p.nodes_label || p.nodes),
    h("td", {}, duration(p.age_seconds)),
    h("td", {}, expiry(p)),
    h("td", { class: "num" }, money(p.hourly_cost)),
    h("td", { class: "num" }, money(p.cost_so_far)),
    h("td", {}, p.kind === "named" ? (p.programs || []).length + " program(s)" :
      `${p.tasks_running} running, ${p.tasks_done} done` + (p.tasks_failed ? `, ${p.tasks_failed} failed` : ""))));
  setMain(
    h("h1", {}, "Pools"),
    pools.length ? table(["pool", "kind", "state", "provider", "nodes", "age", "expires", "$/h", "cost so far", "activity"], rows, { id: "pools" })
      : h("p", { class: "muted", id: "no-pools" }, "No pools. Start one with `skyward up NAME`, from the skyward.toml page, or run a program."),
  );
}

// -- one pool -------------------------------------------------------------------------------
const charts = {}; // node -> {plot, series: {name: [[t, v]]}, el}
window.skywardCharts = charts;

function chartFor(node, container) {
  let c = charts[node];
  if (c && c.el.isConnected) return c;
  if (c && !c.el.isConnected) { container.replaceWith(c.el); return c; }
  c = { node, series: {}, plot: null, el: container, names: [] };
  charts[node] = c;
  return c;
}

const PALETTE = { cpu: "#2563eb", memory: "#16a34a", gpu: "#dc2626", gpu_memory: "#f59e0b" };

function redraw(c) {
  const names = Object.keys(c.series).filter((n) => (window.skywardUnits || {})[n] === "%" || n in PALETTE).sort();
  if (!names.length) return;
  const tables = names.map((n) => {
    const pts = c.series[n].slice(-POINTS);
    return [pts.map((p) => p[0]), pts.map((p) => p[1])];
  });
  const data = uPlot.join(tables);
  const width = chartWidth(c);
  if (!c.plot || c.names.join() !== names.join()) {
    if (c.plot) c.plot.destroy();
    c.el.replaceChildren();
    c.names = names;
    c.plot = new uPlot({
      width, height: 150,
      scales: { y: { range: [0, 100] } },
      series: [{}, ...names.map((n) => ({ label: n, stroke: PALETTE[n] || "#6b7280", width: 1.5, spanGaps: true }))],
      axes: [{ values: (u, ticks) => ticks.map(hms), incrs: TICK_STEPS, space: 80, size: 32 },
        { values: (u, ticks) => ticks.map((t) => `${t}%`), size: 50 }],
      legend: { show: true, live: false },
    }, data, c.el);
  } else {
    if (c.plot.width !== width) c.plot.setSize({ width, height: 150 });
    c.plot.setData(data);
  }
  c.el.dataset.points = String(data[0].length);
  c.el.dataset.last = String(data[0][data[0].length - 1] || "");
  showChartsNote();
}

// The sentence that explains the empty chart column: on screen only while no chart has a point.
function showChartsNote() {
  const note = document.getElementById("charts-note");
  if (note) note.hidden = Object.values(charts).some((c) => c.el.isConnected && Number(c.el.dataset.points) > 0);
}

// A chart takes what its row leaves of the page's width (so a narrow window does not scroll
// sideways), between 280 and 560 px. Its cell has width 100%: the other cells keep their content's width.
function chartWidth(c) {
  const cell = c.el.closest("td");
  const section = c.el.closest("section");
  if (!cell || !section) return 560;
  const others = [...cell.parentElement.children].filter((td) => td !== cell).reduce((sum, td) => sum + td.offsetWidth, 0);
  const pad = cell.offsetWidth - cell.clientWidth + parseFloat(getComputedStyle(cell).paddingLeft) + parseFloat(getComputedStyle(cell).paddingRight);
  return Math.max(280, Math.min(560, Math.floor(section.clientWidth - others - pad - 4)));
}
window.addEventListener("resize", debounce(() => {
  for (const c of Object.values(charts)) {
    if (!c.plot || !c.el.isConnected) continue;
    const width = chartWidth(c);
    if (c.plot.width !== width) c.plot.setSize({ width, height: 150 });
  }
}, 200));

// A node's key: its index, or "group:index" where the pool's groups repeat indices (live.py).
function nodeKey(group, index) { return group ? `${group}:${index}` : index; }

function addSample(node, name, t, v) {
  const c = charts[node];
  if (!c) return;
  const s = (c.series[name] = c.series[name] || []);
  s.push([t, v]);
  if (s.length > POINTS * 2) s.splice(0, s.length - POINTS);
}

const redrawSoon = {};
function scheduleRedraw(node) {
  if (redrawSoon[node]) return;
  redrawSoon[node] = setTimeout(() => { delete redrawSoon[node]; if (charts[node]) redraw(charts[node]); }, 300);
}

function progress(b) {
  const pct = b.total ? Math.min(100, Math.round((100 * b.done) / b.total)) : 0;
  const status = b.finished ? (b.ok ? "done" : "failed") : "running";
  return h("div", { class: `batch ${status}`, dataset: { batch: b.batch, percent: pct } },
    h("div", { class: "batch-label" }, `${b.kind} ${b.name}: ${b.done}/${b.total}` + (b.failed ? `, ${b.failed} failed` : "") + ` (${pct} %)`),
    h("div", { class: "bar" }, h("div", { class: "fill", style: `width: ${pct}%` })));
}

function nodesSection(detail, live) {
  const hosts = detail.hosts || [];
  window.skywardUnits = (live && live.units) || {};
  const rows = hosts.map((n) => {
    const k = nodeKey(n.group, n.index);  // "group:index" in a pool of several groups
    const box = h("div", { class: "chart", id: `chart-${k}`, dataset: { node: k, points: "0" } });
    const c = chartFor(k, box);
    if (live && live.metrics && live.metrics[String(k)]) {
      c.series = {};
      for (const [name, pts] of Object.entries(live.metrics[String(k)])) c.series[name] = pts.slice();
    }
    return h("tr", { dataset: { node: k } },
      h("td", { class: "num" }, n.group ? `${n.group} ${n.index}` : n.index),
      h("td", {}, n.hostname || "-"),
      h("td", {}, n.private_ip || "-"),
      h("td", {}, n.lost ? badge("lost") : badge("ok")),
      h("td", { class: "chart-cell" }, c.el));
  });
  const image = (detail.config && detail.config.image) || {};
  const note = h("p", { class: "muted", id: "charts-note" }, image.metrics === false
    ? `No charts: this pool's image samples no metrics (metrics = false in [pools.${detail.name}.image]).`
    : "Live CPU/memory/GPU charts appear here as the nodes send samples: while this page is open, " +
      "or while a program uses this pool (sky.Compute(name=...) or `skyward run`).");
  return h("section", { id: "nodes" }, h("h2", {}, `Nodes (${hosts.length})`), note,
    table(["node", "host", "address", "health", "CPU / memory / GPU %"], rows, { id: "nodes-table" }));
}

// pool.serve: each endpoint's URL, its replicas, requests/s, latency (from its histogram), errors.
function servingSection(live) {
  const endpoints = (live && live.endpoints) || [];
  if (!endpoints.length) return null;
  const ms = (s) => (s === null || s === undefined ? "-" : `${(1000 * s).toFixed(1)} ms`);
  const rows = endpoints.map((e) => h("tr", { dataset: { url: e.url } },
    h("td", {}, e.url, e.closed ? " (closed)" : ""),
    h("td", {}, e.replicas.length ? e.replicas.map((r) => `${r.key} on node ${r.node}: ${r.state}`).join(", ") : "none"),
    h("td", { class: "num" }, `${Number(e.requests_per_second).toFixed(1)}/s`),
    h("td", { class: "num" }, e.requests),
    h("td", { class: "num" }, ms(e.p50_seconds)),
    h("td", { class: "num" }, ms(e.p99_seconds)),
    h("td", { class: "num" }, e.errors + (e.client_errors ? ` (+${e.client_errors} 4xx)` : "")),
    h("td", { class: "num" }, `${e.in_flight} / ${e.queued}`),
    h("td", { class: "num" }, e.cold_starts)));
  return h("section", { id: "serving" }, h("h2", {}, `Serving (${endpoints.length})`),
    table(["url", "replicas", "requests/s", "requests", "p50", "p99", "5xx errors", "in flight / queued", "cold starts"],
      rows, { id: "endpoints-table" }));
}

function tasksSection(detail, live) {
  const batches = detail.batches || (live && live.batches) || [];
  const running = (live && live.running) || [];
  const finished = ((live && live.finished) || []).slice(0, 25);
  return h("section", { id: "tasks" }, h("h2", {}, "Tasks"),
    h("div", { id: "batches" }, batches.length ? batches.map(progress) : h("p", { class: "muted" }, "No map or gather yet.")),
    h("h3", {}, `Running (${running.length})`),
    running.length ? table(["task", "function", "node", "items", "since"], running.map((t) =>
      h("tr", {}, h("td", {}, t.task), h("td", {}, t.name), h("td", {}, t.group ? `${t.group} ${t.node}` : t.node), h("td", {}, t.items), h("td", {}, clock(t.time)))), { id: "running" })
      : h("p", { class: "muted" }, "Nothing running."),
    h("h3", {}, "Finished (latest)"),
    finished.length ? table(["task", "function", "node", "items", "seconds", "result"], finished.map((t) =>
      h("tr", {}, h("td", {}, t.task), h("td", {}, t.name), h("td", {}, t.group ? `${t.group} ${t.node}` : t.node), h("td", {}, t.items),
        h("td", {}, Number(t.seconds || 0).toFixed(3)), h("td", {}, t.ok ? "ok" : "failed"))), { id: "finished" })
      : h("p", { class: "muted" }, "None yet."));
}

function outputSection(detail, live) {
  const out = (live && live.output) || {};
  const blocks = Object.entries(out).map(([node, lines]) =>
    h("div", { class: "log" }, h("h3", {}, `node ${node}: task output`), h("pre", { id: `output-${node}` }, lines.slice(-60).join("\n"))));
  const section = h("section", { id: "logs" }, h("h2", {}, "Logs"), blocks.length ? blocks : h("p", { class: "muted" }, "No task output yet."));
  if (detail.kind === "named" && !["expired", "asleep"].includes(detail.state)) {
    const target = h("div", { id: "agent-logs" });
    section.append(h("button", {
      id: "load-agent-logs",
      onclick: async (e) => {
        e.target.disabled = true;
        target.replaceChildren(h("p", { class: "muted" }, "reading the agent logs..."));
        try {
          const logs = await api(`/api/pools/${encodeURIComponent(REF)}/logs?lines=80`);
          target.replaceChildren(...logs.map((l) => h("div", { class: "log" },
            h("h3", {}, `node ${l.node}: agent log (${l.hostname || ""})`), h("pre", {}, l.error || l.text))));
        } catch (err) { target.replaceChildren(h("p", { class: "error" }, err.message)); }
        e.target.disabled = false;
      },
    }, "Show the agents' log tail"), target);
  }
  return section;
}

function historySection(entries) {
  const skip = new Set(["time", "who", "event", "name", "skyward", "stack_updates", "pool"]);
  const rows = entries.slice().reverse().map((e) => h("tr", { dataset: { event: e.event } },
    h("td", {}, when(e.time)), h("td", {}, e.who || "?"), h("td", { class: "event" }, e.event || "?"),
    h("td", {}, e.pool || ""),
    h("td", { class: "details" }, Object.keys(e).filter((k) => !skip.has(k)).sort().map((k) => `${k}=${typeof e[k] === "object" ? JSON.stringify(e[k]) : e[k]}`).join(", "))));
  return h("section", { id: "audit" }, h("h2", {}, "Audit trail"),
    rows.length ? table(["when", "who", "what", "pool id", "details"], rows, { id: "audit-table" }) : h("p", { class: "muted" }, "Nothing recorded."));
}

// A pool of nodes = [0, N]: each wake, how long it took, and once it slept again what it cost.
function wakesSection(detail) {
  if (!detail.may_sleep) return null;
  const asleep = detail.state === "asleep" ? h("p", { class: "muted", id: "asleep-note" },
    `Asleep: no node runs and it costs nothing; a program's first task wakes it (up to ${detail.max_nodes} node(s)).`) : null;
  const rows = (detail.wakes || []).slice().reverse().map((w) => h("tr", {},
    h("td", {}, when(w.at)), h("td", { class: "num" }, w.seconds === null || w.seconds === undefined ? "-" : `${Number(w.seconds).toFixed(2)} s`),
    h("td", { class: "num" }, w.nodes === undefined ? "-" : w.nodes),
    h("td", {}, w.awake_seconds === null || w.awake_seconds === undefined ? "awake now" : duration(w.awake_seconds)),
    h("td", { class: "num" }, w.cost === null || w.cost === undefined ? "-" : money(w.cost))));
  return h("section", { id: "wakes" }, h("h2", {}, "Wakes"), asleep,
    rows.length ? table(["woke", "took", "nodes", "awake for", "cost"], rows, { id: "wakes-table" })
      : h("p", { class: "muted" }, "It has not woken yet."));
}

function stackSection(stack) {
  if (!stack || (!stack.stack && !Object.keys(stack.updates || {}).length)) return h("section", { id: "stack", hidden: true });
  const parts = [h("h2", {}, `Cloud stack ${stack.stack || ""}`)];
  if (stack.resources && stack.resources.length) {
    parts.push(table(["type", "name", "detail"], stack.resources.map((r) => h("tr", {}, h("td", {}, r.type), h("td", {}, r.name), h("td", {}, r.detail || ""))), { id: "stack-resources" }));
  }
  if (stack.resources_error) parts.push(h("p", { class: "error" }, stack.resources_error));
  for (const [name, updates] of Object.entries(stack.updates || {})) {
    parts.push(h("h3", {}, `Pulumi updates of ${name}, newest first`));
    parts.push(table(["kind", "result", "start", "end", "changes"], updates.map((u) => h("tr", {},
      h("td", {}, u.kind), h("td", {}, u.result || u.message || ""), h("td", {}, u.start || "-"), h("td", {}, u.end || "-"),
      h("td", {}, Object.entries(u.changes || {}).map(([k, v]) => `${k} ${v}`).join(", "))))));
  }
  return h("section", { id: "stack" }, parts);
}

function actions(detail) {
  if (detail.kind !== "named" || ["expired", "failed", "provisioning", "destroyed"].includes(detail.state)) return null;
  // A re-render (live updates) keeps what the user typed in the box.
  const typed = document.getElementById("resize-nodes");
  const keep = typed && typed.dataset.touched === "1" ? typed.value : null;
  const size = h("input", {
    type: "number", min: detail.may_sleep ? 0 : 1, value: keep !== null ? keep : detail.nodes, id: "resize-nodes", "aria-label": "nodes",
    dataset: keep !== null ? { touched: "1" } : {}, oninput: (e) => { e.target.dataset.touched = "1"; },
  });
  const resize = h("button", {
    id: "resize",
    onclick: async () => {
      const n = parseInt(size.value, 10);
      const least = detail.may_sleep ? 0 : 1;
      if (!(n >= least)) { flash(`give a number of nodes, ${least} or more` + (least ? "" : " (0 puts it to sleep)")); return; }
      if (!(await confirmAction(`Resize pool ${detail.name} from ${detail.nodes} to ${n} node(s)?`))) return;
      resize.disabled = true; resize.textContent = "resizing...";
      try { await api(`/api/pools/${encodeURIComponent(detail.name)}/resize`, { method: "POST", body: JSON.stringify({ nodes: n }) }); flash(`pool ${detail.name} now has ${n} node(s)`, "ok"); }
      catch (e) { flash(e.message); }
      loadPool();
    },
  }, "Resize");
  const down = h("button", {
    id: "down", class: "danger",
    onclick: async () => {
      if (!(await confirmAction(`Stop pool ${detail.name} and destroy its ${detail.nodes} node(s)? Programs attached to it lose it.`))) return;
      down.disabled = true; down.textContent = "stopping...";
      try { await api(`/api/pools/${encodeURIComponent(detail.name)}`, { method: "DELETE" }); flash(`pool ${detail.name} destroyed`, "ok"); }
      catch (e) { flash(e.message); }
      loadPool();
    },
  }, "Down");
  return h("div", { class: "actions" }, size, resize, down);
}

let detail = null;
const poolTicket = tickets();
async function loadPool() {
  const current = poolTicket();
  let d;
  try { d = await api(`/api/pools/${encodeURIComponent(REF)}`); }
  catch (e) {
    if (!current()) return;
    detail = null;
    setMain(h("h1", {}, REF), h("p", { class: "error", id: "pool-error" }, e.message), h("p", {}, h("a", { href: "/" }, "all pools")));
    document.body.dataset.state = "gone";
    return;
  }
  if (!current()) return;
  detail = d;
  document.body.dataset.state = d.state;
  const live = d.kind === "program" ? d : d.live;
  const head = h("div", { class: "pool-head" }, h("h1", {}, d.name || d.ref, " ", badge(d.state)), h("dl", { class: "facts" }));
  const facts = [["kind", d.kind === "named" ? "named pool" : `program ${d.program} (pid ${d.pid})`],
    ["provider", d.provider], ["nodes", d.nodes_label || d.nodes], ["age", duration(d.age_seconds)], ["expires", expiry(d)],
    ["$/h", money(d.hourly_cost)], ["cost so far", money(d.cost_so_far)]];
  if (d.kind === "named") facts.push(["owner", d.owner || "-"], ["clients", (d.clients || []).length], ["offer", d.offer || "-"]);
  // One element per fact, so that a label and its value always wrap together.
  head.querySelector("dl").replaceChildren(...facts.map(([k, v]) => h("div", { class: "fact" }, h("dt", {}, k), h("dd", {}, v))));
  const programs = (d.programs || []).length ? h("p", { class: "muted" }, "Used now by: " + d.programs.map((p) => `${p.program} (pid ${p.pid})`).join(", ")) : null;
  setMain(head, actions(d), programs, wakesSection(d), servingSection(live), nodesSection(d, live), tasksSection(d, live), outputSection(d, live),
    h("section", { id: "audit" }), h("section", { id: "stack", hidden: true }));
  for (const node of Object.keys(charts)) redraw(charts[node]);
  showChartsNote();
  if (d.kind === "named") { loadHistory(); loadStack(); }
}

const historyTicket = tickets();
async function loadHistory() {
  const current = historyTicket();
  try {
    const rows = await api(`/api/pools/${encodeURIComponent(REF)}/history`);
    const here = document.getElementById("audit");
    if (current() && here) here.replaceWith(historySection(rows));
  } catch (e) { console.error(e); }
}

let stackLoaded = null;
async function loadStack() {
  try {
    stackLoaded = stackLoaded || await api(`/api/pools/${encodeURIComponent(REF)}/stack`);
    document.getElementById("stack").replaceWith(stackSection(stackLoaded));
  } catch (e) { console.error(e); }
}

function onPoolMessages(messages) {
  let reload = false, history = false;
  for (const m of messages) {
    if (m.type === "changed") {
      if (m.what === "audit" && m.ref === REF) history = true;
      else if (m.what === "pools") reload = true;
    } else if (m.type === "events") {
      for (const e of m.events) {
        if (e.type === "Metric") {
          if (window.skywardUnits) window.skywardUnits[e.name] = e.unit;
          addSample(nodeKey(e.group, e.node), e.name, e.time, e.value);
          scheduleRedraw(nodeKey(e.group, e.node));
        } else {
          reload = true;
        }
      }
    }
  }
  if (reload) reloadPool();
  if (history && detail && detail.kind === "named") reloadHistory();
}
const reloadPool = debounce(loadPool, 700);
const reloadHistory = debounce(loadHistory, 500);

// -- skyward.toml -----------------------------------------------------------------------------
const configTicket = tickets();
async function renderConfig() {
  const current = configTicket();
  let cfg;
  try { cfg = await api("/api/config"); } catch (e) { if (current()) setMain(h("p", { class: "error" }, e.message)); return; }
  if (!current()) return;
  const rows = [];
  for (const p of cfg.pools) {
    const out = h("td", { colspan: 7, class: "preview" });
    const previewRow = h("tr", { class: "preview-row", hidden: true, id: `preview-${p.name}` }, out);
    const previewBtn = h("button", {
      class: "preview-btn", dataset: { pool: p.name },
      onclick: async () => {
        previewRow.hidden = false;
        out.replaceChildren(h("span", { class: "muted" }, "previewing (creates nothing)..."));
        try {
          const pv = await api(`/api/config/${encodeURIComponent(p.name)}/preview`);
          out.replaceChildren(
            h("p", {}, `${pv.nodes} ${pv.provider} node(s)` + (pv.accelerator ? ` with ${pv.accelerator}` : "") +
              `, ttl ${pv.ttl} s, ${money(pv.hourly_cost)}/h` + (pv.stack ? `, stack ${pv.stack}` : "")),
            table(["", "type", "name", "detail"], (pv.resources || []).map((r) => h("tr", {}, h("td", {}, "+"), h("td", {}, r.type), h("td", {}, r.name), h("td", {}, r.detail || "")))),
            ...(pv.notes || []).map((n) => h("p", { class: "muted" }, `note: ${n}`)));
        } catch (e) { out.replaceChildren(h("span", { class: "error" }, e.message)); }
      },
    }, "Preview");
    const upBtn = h("button", {
      class: "up-btn", dataset: { pool: p.name }, disabled: p.running || !!p.error,
      onclick: async () => {
        if (!(await confirmAction(`Start pool ${p.name} (${p.nodes} ${p.provider} node(s))? It keeps running until its ttl passes with no client, or Down.`))) return;
        upBtn.disabled = true; upBtn.textContent = "starting...";
        try { await api("/api/pools", { method: "POST", body: JSON.stringify({ name: p.name }) }); window.location.href = `/pools/${encodeURIComponent(p.name)}`; }
        catch (e) { flash(e.message); upBtn.disabled = false; upBtn.textContent = "Up"; }
      },
    }, "Up");
    rows.push(h("tr", { dataset: { pool: p.name } },
      h("td", {}, p.running ? h("a", { href: `/pools/${encodeURIComponent(p.name)}` }, p.name) : p.name),
      h("td", {}, p.error ? h("span", { class: "error" }, p.error) : p.provider),
      h("td", {}, p.error ? "" : JSON.stringify(p.nodes)), h("td", {}, p.accelerator || "-"), h("td", {}, p.ttl === undefined ? "" : p.ttl),
      h("td", {}, p.running ? badge("running") : badge("not running")),
      h("td", {}, previewBtn, " ", upBtn)), previewRow);
  }
  setMain(h("h1", {}, "skyward.toml"), h("p", { class: "muted" }, cfg.source),
    cfg.pools.length ? table(["pool", "provider", "nodes", "accelerator", "ttl", "now", ""], rows, { id: "config-pools" })
      : h("p", { class: "muted" }, "No [pools.NAME] tables."));
}

// -- start --------------------------------------------------------------------------------------
// Inside another page's frame (one the browser let through, whatever the server's headers said)
// the page acts on nothing: no data, no buttons, no live updates, only a notice. A page that
// cannot even read window.top is framed by another origin.
function framed() {
  try { return window.top !== window.self; } catch (e) { return true; }
}

if (framed()) {
  document.getElementById("live-status").textContent = "";
  setMain(h("p", { class: "error", id: "framed" },
    "This dashboard page is inside another page's frame, so it does nothing here: open it in a tab of its own."));
} else if (PAGE === "pools") {
  renderPools();
  const again = debounce(renderPools, 1000);
  connect(null, (messages) => { if (messages.some((m) => m.type !== "hello")) again(); });
} else if (PAGE === "pool") {
  loadPool();
  connect(REF, onPoolMessages);
} else if (PAGE === "config") {
  renderConfig();
  const again = debounce(renderConfig, 1000);
  connect(null, (messages) => { if (messages.some((m) => m.type === "changed" && m.what === "pools")) again(); });
}
