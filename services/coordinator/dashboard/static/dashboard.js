// rollway dashboard: one page, five views, live by server-sent events (api/events).
// Plain JS and uPlot (vendored); every URL is relative, so the page works behind a path prefix.
"use strict";

const state = {
  view: "runs",
  run: null,            // the selected run id
  compare: new Set(),   // runs overlaid in Metrics
  runs: [],             // summaries (api/runs, then "runs" events)
  records: {},          // run id -> metrics records (from "metrics" events)
  steps: {},            // run id -> steps with stored rollouts
  charts: {},           // metric -> uPlot
  events: null,
};
window.rollwayDashboard = state;  // tests (and curious users) read charts and records here

const $ = (sel) => document.querySelector(sel);
const el = (tag, attrs = {}, ...children) => {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(c ?? ""));
  return node;
};
const api = async (path, options) => {
  const reply = await fetch("api/" + path, options);
  if (!reply.ok) throw new Error(`${path}: ${reply.status} ${await reply.text()}`);
  return reply.json();
};
const fmt = (v, digits = 4) => (v == null ? "—" : typeof v === "number" ? +v.toFixed(digits) + "" : v);
const hms = (s) => (s == null ? "—" : new Date(s * 1000).toISOString().substr(11, 8));
// Steps are whole numbers: the x axis ticks only those.
const STEP_AXES = [{ incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000], values: (u, ticks) => ticks.map((t) => t.toFixed(0)) }, {}];
const PALETTE = ["#1f6feb", "#cf222e", "#1a7f37", "#9a6700", "#8250df", "#bf3989", "#0a7ea4", "#57606a"];

// ---------- navigation ----------
function show(view) {
  state.view = view;
  document.querySelectorAll(".view").forEach((v) => v.classList.toggle("active", v.id === "view-" + view));
  document.querySelectorAll("#tabs a").forEach((a) => a.classList.toggle("active", a.dataset.view === view));
  refreshView();
}
window.addEventListener("hashchange", () => show(location.hash.slice(1) || "runs"));
$("#run-select").addEventListener("change", (e) => selectRun(e.target.value));

function selectRun(runId) {
  if (state.run === runId) return;
  state.run = runId;
  $("#run-select").value = runId;
  connectEvents();
  renderRuns();
  refreshView();
}

function refreshView() {
  if (!state.run) return;
  if (state.view === "runs") loadRunDetail();
  if (state.view === "metrics") renderCharts();
  if (state.view === "rollouts") loadSteps();
  if (state.view === "services") loadServices();
  if (state.view === "timeline") loadTimeline();
}

// ---------- server push ----------
function connectEvents() {
  if (state.events) state.events.close();
  const runs = [...new Set([state.run, ...state.compare])].filter(Boolean);
  for (const r of runs) state.records[r] = [];  // the stream starts with every record
  const source = new EventSource("api/events?runs=" + encodeURIComponent(runs.join(",")));
  state.events = source;
  source.onopen = () => $("#live-dot").classList.add("on");
  source.onerror = () => $("#live-dot").classList.remove("on");
  source.addEventListener("runs", (e) => {
    const before = state.runs.find((r) => r.run_id === state.run);
    state.runs = JSON.parse(e.data);
    renderRunSelect();
    renderRuns();
    const now = state.runs.find((r) => r.run_id === state.run);
    // A run that ended (failed, stopped) shows why in its detail.
    if (state.view === "runs" && before && now && before.state !== now.state) loadRunDetail();
  });
  source.addEventListener("metrics", (e) => {
    const { run_id, records } = JSON.parse(e.data);
    state.records[run_id] = (state.records[run_id] || []).concat(records);
    if (state.view === "metrics") renderCharts();
    if (state.view === "timeline" && run_id === state.run) loadTimeline();
    if (state.view === "services" && run_id === state.run) loadServices();
  });
  source.addEventListener("rollouts", (e) => {
    const { run_id, steps } = JSON.parse(e.data);
    state.steps[run_id] = steps;
    if (state.view === "rollouts" && run_id === state.run) renderStepSelect();
  });
}

// ---------- Runs ----------
function renderRunSelect() {
  const select = $("#run-select");
  const ids = state.runs.map((r) => r.run_id);
  if ([...select.options].map((o) => o.value).join() !== ids.join()) {
    select.replaceChildren(...ids.map((id) => el("option", { value: id }, id)));
  }
  if (!state.run && ids.length) {
    const wanted = new URLSearchParams(location.search).get("run");
    selectRun(ids.includes(wanted) ? wanted : ids[0]);
  }
  select.value = state.run;
}

function renderRuns() {
  const body = $("#runs-table tbody");
  body.replaceChildren(
    ...state.runs.map((r) => {
      const fraction = r.num_steps ? Math.min(r.step / r.num_steps, 1) : 0;
      const box = el("input", { type: "checkbox", onchange: (e) => toggleCompare(r.run_id, e.target.checked) });
      box.checked = state.compare.has(r.run_id);
      const live = r.state === "RUNNING" || r.state === "STARTING";
      const stop = r.live && live ? el("button", { class: "stop", onclick: () => stopRun(r.run_id) }, "Stop") : "";
      const row = el(
        "tr",
        { "data-run": r.run_id, class: r.run_id === state.run ? "selected" : "" },
        el("td", {}, box),
        el("td", {}, el("a", { href: "#runs", onclick: () => selectRun(r.run_id) }, r.run_id)),
        el("td", {}, r.mode),
        el("td", { class: "state state-" + r.state, title: [r.error, ...(r.notices || [])].filter(Boolean).join("\n") },
          r.state + ((r.notices || []).length ? ` (${r.notices.length} recovered)` : "")),
        el("td", {}, el("span", { class: "bar" }, el("span", { style: `width:${fraction * 100}%` })),
          ` ${r.step}/${r.num_steps || "?"}`),
        el("td", {}, fmt(r.seconds_per_step, 2)),
        el("td", {}, hms(r.eta_seconds)),
        el("td", {}, stop),
      );
      return row;
    }),
  );
}

function toggleCompare(runId, on) {
  if (on) state.compare.add(runId);
  else state.compare.delete(runId);
  connectEvents();
}

async function stopRun(runId) {
  await api(`runs/${encodeURIComponent(runId)}/stop`, { method: "POST" });
}

async function loadRunDetail() {
  const run = await api(`runs/${encodeURIComponent(state.run)}`);
  const error = run.error ? el("p", { class: "error-text" }, run.error) : "";
  // What the run survived (restarts of dead or hung services, skipped checkpoints), one line each.
  const notices = (run.notices || []).length
    ? el("ul", { class: "notices" }, ...run.notices.map((n) => el("li", {}, n)))
    : "";
  $("#run-detail").replaceChildren(
    el("div", {}, el("h3", {}, `${run.run_id}: config as given`), error, notices, el("pre", { id: "config-given" }, JSON.stringify(run.config_given, null, 1))),
    el("div", {}, el("h3", {}, "as resolved (every setting, per service)"), el("pre", { id: "config-resolved" }, JSON.stringify(run.config_resolved, null, 1))),
  );
}

// ---------- Metrics ----------
// Miles' names first, in the order one reads a run: reward, eval, losses, KL, clipping, entropy,
// gradients, lengths, truncation, staleness, train/rollout mismatch (TIS); then everything else.
const METRIC_ORDER = [
  "rollout/raw_reward", "rollout/rewards", "eval/accuracy", /^eval\//, "train/loss", "train/pg_loss",
  "sft/loss", "sft/per_token_loss", "train/kl_loss", "train/ppo_kl", /kl/, "train/pg_clipfrac", /clipfrac/,
  "train/entropy_loss", /entropy/, "train/grad_norm", "rollout/response_len/mean", /response_len/,
  "rollout/truncated_ratio", /staleness/, /^(train|rollout)\/.*(tis|mismatch|log_?prob)/, "rollout/weight_version", /^rollout\//,
  /^train\//, /^sft\//, /^perf\//, /./,
];
const rank = (key) => METRIC_ORDER.findIndex((p) => (typeof p === "string" ? p === key : p.test(key)));

function smooth(values, weight) {
  // TensorBoard's debiased exponential moving average over the points present.
  if (!weight) return values;
  let last = 0, n = 0;
  return values.map((v) => {
    if (v == null) return null;
    last = last * weight + (1 - weight) * v;
    n += 1;
    return last / (1 - Math.pow(weight, n));
  });
}

function renderCharts() {
  const runs = [...new Set([state.run, ...state.compare])].filter((r) => state.records[r]);
  const filter = $("#metric-filter").value.trim();
  const keys = new Set();
  for (const r of runs) for (const rec of state.records[r]) for (const k of Object.keys(rec)) keys.add(k);
  ["step", "time"].forEach((k) => keys.delete(k));
  const sorted = [...keys].filter((k) => !filter || k.includes(filter)).sort((a, b) => rank(a) - rank(b) || a.localeCompare(b));
  const weight = +$("#smoothing").value;
  const container = $("#charts");
  const signature = runs.join(",") + "|" + sorted.join(",");
  if (container.dataset.signature !== signature) {
    Object.values(state.charts).forEach((c) => c.destroy());
    state.charts = {};
    container.replaceChildren();
    container.dataset.signature = signature;
  }
  for (const key of sorted) {
    const steps = [...new Set(runs.flatMap((r) => state.records[r].filter((x) => key in x).map((x) => x.step)))].sort((a, b) => a - b);
    const series = runs.map((r) => {
      const byStep = new Map(state.records[r].filter((x) => key in x).map((x) => [x.step, x[key]]));
      return smooth(steps.map((s) => (byStep.has(s) ? byStep.get(s) : null)), weight);
    });
    const data = [steps, ...series];
    if (state.charts[key]) {
      state.charts[key].setData(data);
      continue;
    }
    const box = el("div", { class: "chart", "data-metric": key }, el("h4", {}, key));
    container.append(box);
    const width = Math.max(box.clientWidth - 12, 300);
    state.charts[key] = new uPlot(
      {
        width, height: 180,
        cursor: { drag: { x: true, y: false }, sync: { key: "metrics" } },
        scales: { x: { time: false } },
        axes: STEP_AXES,
        series: [{ label: "step" }, ...runs.map((r, i) => ({ label: r, stroke: PALETTE[i % PALETTE.length], width: 1.5, spanGaps: true, points: { show: steps.length < 60 } }))],
        legend: { show: runs.length > 1 },
      },
      data, box,
    );
  }
}
$("#smoothing").addEventListener("input", (e) => {
  $("#smoothing-value").textContent = e.target.value;
  renderCharts();
});
$("#metric-filter").addEventListener("input", renderCharts);

// ---------- Rollouts ----------
const COLOURS = {
  // value -> [r, g, b, alpha]
  rollout_log_probs: (v) => [220, 50, 47, Math.min(-v / 5, 1) * 0.85],
  entropy: (v) => [130, 80, 223, Math.min(v / 4, 1) * 0.85],
  train_rollout_log_prob_diff: (v) => (v >= 0 ? [31, 111, 235, Math.min(v / 0.2, 1) * 0.85] : [207, 34, 46, Math.min(-v / 0.2, 1) * 0.85]),
};
const LEGENDS = {
  rollout_log_probs: "white: log-prob 0 (certain) … red: ≤ −5",
  entropy: "white: entropy 0 … purple: ≥ 4 nats",
  train_rollout_log_prob_diff: "red: trainer lower … blue: trainer higher (saturates at ±0.2)",
};
const LABELS = { rollout_log_probs: "rollout log-prob", trainer_log_probs: "trainer log-prob", entropy: "entropy", train_rollout_log_prob_diff: "trainer − rollout" };

async function loadSteps() {
  if (!state.steps[state.run]) state.steps[state.run] = (await api(`runs/${encodeURIComponent(state.run)}/rollouts`)).steps;
  renderStepSelect();
}

function renderStepSelect() {
  const steps = state.steps[state.run] || [];
  const select = $("#step-select");
  const previous = select.value;
  select.replaceChildren(...steps.map((s) => el("option", { value: s }, s)));
  const wanted = $("#follow-latest").checked || !steps.includes(+previous) ? steps[steps.length - 1] : +previous;
  if (wanted == null) {
    $("#groups").replaceChildren(el("p", { class: "hint" }, "no rollout samples stored for this run (yet)"));
    return;
  }
  select.value = wanted;
  if (+$("#groups").dataset.step !== wanted || $("#groups").dataset.run !== state.run) loadGroups(wanted);
}
$("#step-select").addEventListener("change", (e) => {
  $("#follow-latest").checked = false;
  loadGroups(+e.target.value);
});
$("#colour-by").addEventListener("change", () => colourTokens());

let groupsWanted = null;
async function loadGroups(step) {
  const wanted = (groupsWanted = `${state.run}/${step}`);
  const reply = await api(`runs/${encodeURIComponent(state.run)}/rollouts/${step}`);
  if (wanted !== groupsWanted) return;  // another step was asked for meanwhile: its reply wins
  const groups = $("#groups");
  groups.dataset.step = step;
  groups.dataset.run = state.run;
  groups.replaceChildren(...reply.groups.map(renderGroup));
  colourTokens();
}

function renderGroup(g) {
  return el(
    "div",
    { class: "group" + (g.zero_variance ? " zero-variance" : ""), "data-group": g.group_index },
    el("div", {}, el("b", {}, `group ${g.group_index}`), ` · mean reward ${fmt(g.mean_reward, 3)} · label ${g.label || "—"} `,
      g.zero_variance ? el("span", { class: "badge" }, "zero variance: no learning signal") : ""),
    el("div", { class: "prompt" }, g.prompt),
    ...g.samples.map((s) =>
      el("div", { class: "sample", "data-index": s.index },
        el("div", { class: "facts" },
          `#${s.index} reward ${fmt(s.reward, 3)} · advantage ${fmt(s.advantage, 3)} · v${s.weight_version} · ${s.finish_reason} · ${s.num_tokens} tokens`,
          s.reward_error ? el("div", { class: "error-text" }, s.reward_error) : ""),
        el("div", { class: "tokens", title: s.response_text },
          ...s.tokens.map((t, i) => {
            const span = el("span", { class: "tok", "data-pos": i }, t.text);
            span.token = t;
            return span;
          })),
      )),
  );
}

function colourTokens() {
  const by = $("#colour-by").value;
  const spans = [...document.querySelectorAll("#groups .tok")];
  const recorded = spans.some((span) => span.token[by] != null);
  $("#colour-legend").textContent = recorded || !spans.length ? LEGENDS[by] : "not recorded for this run (the run setting dashboard_trainer_log_probs: true records it)";
  spans.forEach((span) => {
    const v = span.token[by];
    span.dataset.value = v == null ? "" : v;
    const [r, g, b, a] = v == null ? [0, 0, 0, 0] : COLOURS[by](v);
    span.style.background = `rgba(${r},${g},${b},${a})`;
  });
}

$("#groups").addEventListener("mouseover", (e) => {
  const span = e.target.closest(".tok");
  const tip = $("#token-tip");
  if (!span) return;
  const t = span.token;
  const lines = [`token ${JSON.stringify(t.text)} (id ${t.id})`];
  for (const [k, label] of Object.entries(LABELS)) if (t[k] != null) lines.push(`${label}: ${t[k]}`);
  tip.textContent = lines.join("\n");
  const box = span.getBoundingClientRect();
  tip.style.left = box.left + "px";
  tip.style.top = box.bottom + 4 + "px";
  tip.style.display = "block";
});
$("#groups").addEventListener("mouseout", (e) => {
  if (e.target.closest(".tok")) $("#token-tip").style.display = "none";
});

// ---------- Services ----------
let servicesTimer = null;
async function loadServices() {
  clearTimeout(servicesTimer);
  const runId = state.run;
  const reply = await api(`runs/${encodeURIComponent(runId)}/services`);
  $("#services-table tbody").replaceChildren(
    ...reply.services.map((s) =>
      el("tr", { "data-service": `${s.name}-${s.index}` },
        el("td", {}, s.name + (s.index ? ` ${s.index}` : "")),
        el("td", {}, s.address || "—"),
        el("td", { class: s.health === "SERVING" ? "state state-SUCCEEDED" : "state" }, s.health || "—"),
        el("td", {}, s.pid ?? "—"),
        el("td", {}, s.weight_version ?? "—"),
        el("td", {}, s.in_flight_samples ?? "—"),
        el("td", {}, s.last_error ? el("div", { class: "error-text" }, s.last_error) : "—",
          s.log_tail ? el("details", {}, el("summary", {}, "log tail"), el("pre", {}, s.log_tail)) : ""),
      )),
  );
  renderSyncs(reply.weight_syncs);
  const live = state.runs.find((r) => r.run_id === runId && r.live && ["RUNNING", "STARTING"].includes(r.state));
  if (live && state.view === "services") servicesTimer = setTimeout(loadServices, 2000);
}

const SYNC_PHASES = ["weight_sync_gather_time", "weight_sync_pause_time", "weight_sync_wire_time", "weight_sync_load_time", "weight_sync_verify_time"];
function renderSyncs(rows) {
  // Each push's size (MB) and the transport's bandwidth over its wire time (GB/s) after the times.
  const head = ["step", "weight_version", ...SYNC_PHASES, "weight_sync_time", "weight_sync_mb", "weight_sync_gbytes_per_s"];
  const shown = rows.map((r) => ({...r, weight_sync_mb: r.weight_sync_bytes === undefined ? undefined : r.weight_sync_bytes / 1e6}));
  $("#sync-table thead").replaceChildren(el("tr", {}, ...head.map((h) => el("th", {}, h.replace("weight_sync_", "").replace("_time", "").replace("gbytes_per_s", "GB/s").replace("mb", "MB")))));
  $("#sync-table tbody").replaceChildren(...shown.slice(-20).reverse().map((r) => el("tr", {}, ...head.map((h) => el("td", {}, fmt(r[h], 3))))));
  const parts = SYNC_PHASES.map((p) => [p.replace("weight_sync_", "").replace("_time", ""), rows.map((r) => r[p] || 0)]);
  // What the phases leave of the whole update (commit, the group's bookkeeping, the calls).
  parts.push(["other", rows.map((r) => Math.max((r.weight_sync_time || 0) - SYNC_PHASES.reduce((sum, p) => sum + (r[p] || 0), 0), 0))]);
  stackedBars("#sync-chart", "sync", rows.map((r) => r.step), parts);
}

// ---------- Step timeline ----------
async function loadTimeline() {
  const reply = await api(`runs/${encodeURIComponent(state.run)}/timeline`);
  const steps = reply.steps.map((s) => s.step);
  stackedBars("#phase-chart", "phases", steps, reply.phases.map((p) => [p, reply.steps.map((s) => s.phases[p])]));
  const select = $("#trace-step");
  const previous = select.value;
  select.replaceChildren(...steps.map((s) => el("option", { value: s }, s)));
  if (!steps.length) return;
  select.value = steps.includes(+previous) && previous !== "" ? previous : steps[steps.length - 1];
  if ($("#trace").dataset.key !== `${state.run}/${select.value}`) loadTrace(+select.value);
}
$("#trace-step").addEventListener("change", (e) => loadTrace(+e.target.value));

const stacked = {};
state.stacked = stacked;
function stackedBars(selector, name, xs, parts) {
  // uPlot has no stacking: each series is drawn at its cumulative height, the tallest first, so
  // each lower band paints over the one above it.
  const cumulative = [];
  let running = xs.map(() => 0);
  for (const [, values] of parts) {
    running = running.map((v, i) => v + (values[i] || 0));
    cumulative.push(running);
  }
  const order = parts.map((_, i) => i).reverse();
  const data = [xs, ...order.map((i) => cumulative[i])];
  const raw = parts.map(([, values]) => values);
  if (stacked[name] && stacked[name].parts === parts.map((p) => p[0]).join()) {
    stacked[name].plot.raw = raw;
    stacked[name].plot.setData(data);
    return;
  }
  if (stacked[name]) stacked[name].plot.destroy();
  const box = $(selector);
  box.replaceChildren();
  const bars = uPlot.paths.bars({ size: [0.7, 40] });
  const plot = new uPlot(
    {
      width: Math.max(box.clientWidth, 600), height: 240,
      scales: { x: { time: false } },
      axes: STEP_AXES,
      series: [{ label: "step" }, ...order.map((i) => ({
        label: parts[i][0], fill: PALETTE[i % PALETTE.length], stroke: PALETTE[i % PALETTE.length], paths: bars, points: { show: false },
        value: (u, v, si, idx) => (idx == null ? "—" : fmt(u.raw[i][idx], 3)),
      }))],
    },
    data, box,
  );
  plot.raw = raw;
  stacked[name] = { plot, parts: parts.map((p) => p[0]).join() };
}

async function loadTrace(step) {
  const reply = await api(`runs/${encodeURIComponent(state.run)}/trace/${step}`);
  const box = $("#trace");
  box.dataset.key = `${state.run}/${step}`;
  if (!reply.spans.length) {
    $("#trace-note").textContent = reply.trace_file ? `no spans of step ${step} in ${reply.trace_file}` : "this run was not traced (rollway run traces to RUN_DIR/trace.jsonl; a coordinator needs --trace-file)";
    box.replaceChildren();
    return;
  }
  $("#trace-note").textContent = `${reply.spans.length} spans from ${reply.trace_file}`;
  const services = [...new Set(reply.spans.map((s) => s.service))];
  const end = Math.max(...reply.spans.map((s) => s.start_ms + s.duration_ms));
  const rowH = 16, left = 260, width = Math.max(box.clientWidth, 900), plotW = width - left - 20;
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("width", width);
  svg.setAttribute("height", reply.spans.length * rowH + 30);
  const add = (tag, attrs, text) => {
    const node = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    if (text != null) node.textContent = text;
    svg.append(node);
    return node;
  };
  add("text", { x: left, y: 12, "font-size": 11, fill: "#6b7385" }, `0 ms`);
  add("text", { x: left + plotW, y: 12, "font-size": 11, fill: "#6b7385", "text-anchor": "end" }, `${end.toFixed(1)} ms`);
  reply.spans.forEach((s, i) => {
    const y = 20 + i * rowH;
    const colour = PALETTE[services.indexOf(s.service) % PALETTE.length];
    add("text", { x: 4, y: y + 11, "font-size": 11, fill: colour }, `${s.service}: ${s.name}`.slice(0, 44));
    const rect = add("rect", { x: left + (s.start_ms / end) * plotW, y: y + 2, width: Math.max((s.duration_ms / end) * plotW, 1), height: rowH - 4, fill: colour, class: "span" });
    const title = document.createElementNS(ns, "title");
    title.textContent = `${s.service} ${s.name}: ${s.duration_ms.toFixed(2)} ms at +${s.start_ms.toFixed(2)} ms (${s.status})`;
    rect.append(title);
  });
  box.replaceChildren(svg);
}

// ---------- start ----------
(async () => {
  state.runs = await api("runs");
  renderRunSelect();
  show(location.hash.slice(1) || "runs");
})();
