// The dashboard page: fetches the views from /api, draws them with plotly.js, and fetches again each time
// /api/stream says the analyst DB moved. Text from the log is set with textContent, never as HTML.
"use strict";

const GIB = 1024 ** 3;
const params = new URLSearchParams(location.search);
let selected = params.get("study");
let seenTrials = null;

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "class") node.className = value; else node.setAttribute(key, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}
const fmt = (value, digits = 3) => (value === null || value === undefined || Number.isNaN(value)) ? "" : Number(value).toFixed(digits);
const gib = (bytes, digits = 2) => (bytes === null || bytes === undefined) ? "" : (bytes / GIB).toFixed(digits);
const times = (value) => (value === null || value === undefined) ? "" : `×${Number(value).toFixed(2)}`;
const knobText = (knobs) => Object.entries(knobs).map(([k, v]) => `${k}=${v}`).join(", ");
const num = (value) => el("td", { class: "num" }, value);
const badge = (outcome) => el("span", { class: `badge o-${outcome}` }, outcome);

function fillBody(table, rows) {
  const body = document.querySelector(`${table} tbody`);
  body.replaceChildren(...rows);
}

async function getJSON(path) {
  const response = await fetch(path, { credentials: "same-origin" });
  if (!response.ok) throw new Error(`${path}: ${response.status} ${await response.text()}`);
  return response.json();
}

function renderStudies(studies) {
  document.getElementById("no-studies").hidden = studies.length > 0;
  if (!selected && studies.length) selected = studies[0].study_id;
  fillBody("#studies-table", studies.map((s) => {
    const row = el("tr", { "data-study": s.study_id, class: s.study_id === selected ? "selected" : "" },
      el("td", {}, el("a", { href: `?study=${encodeURIComponent(s.study_id)}` }, s.name)),
      el("td", {}, el("code", {}, s.study_id.slice(0, 12))),
      el("td", { class: "stage" }, s.stage), el("td", {}, s.accelerator),
      num(s.trials), num(s.running), num(s.failed), num(fmt(s.accelerator_hours, 3)),
      num(times(s.best_search_speedup)), num(times(s.best_verified_speedup)),
      el("td", {}, (s.created_at || "").replace("T", " ").slice(0, 19)));
    return row;
  }));
}

function card(label, value) { return el("div", { class: "card" }, el("b", {}, value), label); }

function renderSummary(study) {
  document.getElementById("study-title").textContent = `${study.name} — ${study.stage}`;
  document.getElementById("study-goal").textContent = `${study.goal} (${study.study_id})`;
  document.getElementById("cards").replaceChildren(
    card("stage", study.stage),
    card("trials", study.trials.length),
    card("best search speed-up", times(study.best_search_speedup) || "—"),
    card("best verified speed-up", times(study.best_verified_speedup) || "—"),
    card("accelerator-hours", fmt(study.accelerator_hours, 3)),
    card("baseline step", study.baseline_step_time_s ? `${fmt(study.baseline_step_time_s)} s` : "—"),
    card("memory capacity", study.memory_capacity_bytes ? `${gib(study.memory_capacity_bytes, 1)} GiB` : "—"),
    card("accelerator", study.accelerator || "—"));
}

const LAYOUT = { margin: { t: 44, r: 16, b: 90, l: 60 }, legend: { orientation: "h", y: -0.3 }, font: { size: 12 } };
// Titles on the left, so that plotly's tool bar (top right, on hover) never covers them.
const title = (text) => ({ text, x: 0.01, xanchor: "left", font: { size: 14 } });
const axisTitle = (text) => ({ text });
const OUTCOME_COLORS = { ok: "#2563eb", oom: "#dc2626", crash: "#f59e0b", timeout: "#a16207", invariant_violation: "#db2777",
  scope_violation: "#9333ea", patch_conflict: "#7c3aed", stopped_slow: "#6b7280", running: "#93c5fd", proposed: "#bfdbfe" };
const CONFIG = { displaylogo: false, responsive: true };

function renderSearch(study) {
  const points = study.best_over_trials;
  const detectable = study.doctor ? study.doctor.min_detectable_speedup : null;
  const shapes = [{ type: "line", xref: "paper", x0: 0, x1: 1, y0: 1, y1: 1, line: { color: "#9ca3af", dash: "dot" } }];
  if (detectable) shapes.push({ type: "line", xref: "paper", x0: 0, x1: 1, y0: detectable, y1: detectable, line: { color: "#f59e0b", dash: "dash" } });
  Plotly.react("plot-best", [
    { name: "trial (ok, invariants held)", mode: "markers", x: points.filter((p) => p.counts).map((p) => p.n),
      y: points.filter((p) => p.counts).map((p) => p.speedup), text: points.filter((p) => p.counts).map((p) => p.trial_id),
      marker: { color: "#2563eb", size: 8 } },
    { name: "trial (not a win: invariant failed)", mode: "markers", x: points.filter((p) => !p.counts).map((p) => p.n),
      y: points.filter((p) => !p.counts).map((p) => p.speedup), text: points.filter((p) => !p.counts).map((p) => p.trial_id),
      marker: { color: "#db2777", symbol: "diamond-open", size: 9 } },
    { name: "best so far", mode: "lines", line: { shape: "hv", color: "#16a34a", width: 2 },
      x: points.filter((p) => p.best !== null).map((p) => p.n), y: points.filter((p) => p.best !== null).map((p) => p.best) },
  ], { ...LAYOUT, title: title("Speed-up over trials (dashed: the doctor's smallest detectable)"),
       xaxis: { title: axisTitle("trial #") }, yaxis: { title: axisTitle("speed-up vs baseline") }, shapes }, CONFIG);

  const measured = study.trials.filter((t) => t.step_time_s !== null && t.peak_bytes !== null);
  const ooms = study.trials.filter((t) => t.outcome === "oom");
  const top = measured.length ? Math.max(...measured.map((t) => t.step_time_s)) * 1.15 : 1;
  const steps = measured.map((t) => t.step_time_s);
  const logY = steps.length > 1 && Math.max(...steps) / Math.min(...steps) > 4;
  const memShapes = [];
  if (study.memory_capacity_bytes) memShapes.push({ type: "line", yref: "paper", y0: 0, y1: 1,
    x0: study.memory_capacity_bytes / GIB, x1: study.memory_capacity_bytes / GIB, line: { color: "#dc2626", width: 2 } });
  const kinds = [...new Set(measured.map((t) => t.kind))];
  Plotly.react("plot-memory", [
    ...kinds.map((kind) => {
      const these = measured.filter((t) => t.kind === kind);
      return { name: kind, mode: "markers", x: these.map((t) => t.peak_bytes / GIB), y: these.map((t) => t.step_time_s),
               text: these.map((t) => `${t.trial_id} ${knobText(t.knobs)} ${t.patches.join(" ")}`), marker: { size: 8 } };
    }),
    { name: "OOM (peak > this)", mode: "markers", x: ooms.map((t) => (t.censored_peak_bytes || t.peak_bytes || 0) / GIB),
      y: ooms.map(() => top), text: ooms.map((t) => `${t.trial_id} OOM ${knobText(t.knobs)}`),
      marker: { symbol: "x", size: 12, color: "#dc2626" } },
  ], { ...LAYOUT, title: title("Step time vs peak memory (red line: capacity)"), shapes: memShapes,
       annotations: study.memory_capacity_bytes ? [{ x: study.memory_capacity_bytes / GIB, yref: "paper", y: 1, text: "capacity",
         showarrow: false, xanchor: "right", font: { color: "#dc2626" } }] : [],
       xaxis: { title: axisTitle("peak memory (GiB)") }, yaxis: { title: axisTitle("step time (s)"), type: logY ? "log" : "linear" } }, CONFIG);
}

function renderSpace(study) {
  const space = study.search_space;
  if (!space.dimensions.length || !space.speedup.length) { Plotly.purge("plot-space"); return; }
  const dimensions = space.dimensions.map((d) => {
    if (!d.categorical) return { label: d.label, values: d.values };
    const levels = [...new Set(d.values)].sort();
    return { label: d.label, values: d.values.map((v) => levels.indexOf(v)), tickvals: levels.map((_, i) => i), ticktext: levels };
  });
  dimensions.push({ label: "speed-up", values: space.speedup });
  Plotly.react("plot-space", [{
    type: "parcoords", dimensions,
    line: { color: space.speedup, colorscale: "Viridis", showscale: true, colorbar: { title: { text: "speed-up" } } },
  }], { ...LAYOUT, margin: { t: 100, r: 80, b: 30, l: 80 }, title: title("Search space: each measured search trial's knobs and patches against its speed-up") }, CONFIG);
}

// optuna-dashboard's importance, slice and contour views over ``study.analysis`` (views.search_analysis): every
// search trial with a final outcome, OOMs and crashes included, each dimension's value per trial.
const FAILED_MARK = { oom: { symbol: "x", size: 11, color: "#dc2626" }, other: { symbol: "triangle-down", size: 10, color: "#f59e0b" } };
const measuredOf = (a) => a.trials.map((t, i) => ({ t, i })).filter(({ t }) => t.step_time_s !== null);
const failedOf = (a, oom) => a.trials.map((t, i) => ({ t, i }))
  .filter(({ t }) => t.step_time_s === null && (t.outcome === "oom") === oom);
const stepAxisIsLog = (steps) => steps.length > 1 && Math.max(...steps) / Math.min(...steps) > 4;
const fewLevels = (d) => d.categorical || new Set(d.values).size <= 8;
const levelsOf = (d) => [...new Set(d.values)].sort((a, b) => String(a).localeCompare(String(b), "en", { numeric: true }));
// The cells of one pair-map axis: a dimension's levels, or 6 equal bins of a numeric one with many values.
function cellsOf(d) {
  if (fewLevels(d)) {
    const labels = levelsOf(d).map(String);
    return { labels, index: (i) => labels.indexOf(String(d.values[i])) };
  }
  const low = Math.min(...d.values), width = (Math.max(...d.values) - low) / 6 || 1;
  const bin = (i) => Math.min(5, Math.floor((d.values[i] - low) / width));
  return { labels: [0, 1, 2, 3, 4, 5].map((b) => (low + (b + 0.5) * width).toPrecision(3)), index: bin };
}
const trialText = (a, i) => `${a.trials[i].trial_id} #${a.trials[i].n} ${a.trials[i].outcome}<br>`
  + a.dimensions.map((d) => `${d.label}=${d.values[i]}`).join(", ");

function renderImportance(study) {
  const a = study.analysis;
  const note = document.getElementById("importance-note");
  const counts = `${a.timed_trials} search trial(s) with a step time; ${a.oom_trials} of ${a.ran_trials} that ran went out of memory`;
  if (!a.importance.length) {
    note.textContent = `Needs ${a.min_trials} finished search trials that differ (${counts}).`;
    Plotly.purge("plot-importance");
    return;
  }
  note.textContent = `Share of each target's variance carried by a knob's main effect, from an additive model fitted over `
    + `all knobs and patches at once (docs/dashboard.md); "unexplained" is the rest: interactions and noise. ${counts}.`;
  const order = a.importance[0].ranked.map((r) => r.label).reverse();
  const labels = ["unexplained", ...order];
  const traces = a.importance.map((imp) => ({
    type: "bar", orientation: "h", y: labels, name: `${imp.target} (${imp.trials} trials)`,
    x: labels.map((label) => 100 * (label === "unexplained" ? imp.unexplained : (imp.ranked.find((r) => r.label === label) || { share: 0 }).share)),
    marker: { color: imp.target === "OOM" ? "#dc2626" : "#2563eb" },
    hovertemplate: "%{y}: %{x:.1f} %<extra>%{fullData.name}</extra>",
  }));
  Plotly.react("plot-importance", traces, { ...LAYOUT, barmode: "group", height: 120 + 36 * labels.length,
    margin: { ...LAYOUT.margin, l: 170 }, title: title("Importance: share of the variance of the log step time and of OOM"),
    xaxis: { title: axisTitle("% of variance"), range: [0, 100] } }, CONFIG);
}

function renderSlices(study) {
  const a = study.analysis;
  if (!a.dimensions.length || !a.trials.length) { Plotly.purge("plot-slices"); return; }
  const measured = measuredOf(a);
  const steps = measured.map(({ t }) => t.step_time_s);
  const logY = stepAxisIsLog(steps);
  const top = steps.length ? Math.max(...steps) * (logY ? 1.6 : 1.15) : 1;
  const columns = Math.min(3, a.dimensions.length), rows = Math.ceil(a.dimensions.length / columns);
  const traces = [], layout = { ...LAYOUT, height: 60 + 300 * rows, showlegend: true,
    title: title("Step time against each dimension (crosses: out of memory, drawn above the slowest; triangles: crashes, timeouts, refused)"),
    grid: { rows, columns, pattern: "independent", ygap: 0.45 }, margin: { t: 60, r: 16, b: 90, l: 60 } };
  a.dimensions.forEach((d, k) => {
    const axis = k === 0 ? "" : String(k + 1);
    const on = { xaxis: `x${axis}`, yaxis: `y${axis}`, showlegend: k === 0 };
    const groups = [
      ["ran ok", measured.filter(({ t }) => t.outcome === "ok"), { color: "#2563eb", size: 8 }],
      ["invariant failed", measured.filter(({ t }) => t.outcome !== "ok"), { color: "#db2777", symbol: "diamond-open", size: 9 }],
    ];
    for (const [name, these, marker] of groups) {
      traces.push({ ...on, name, legendgroup: name, mode: "markers", marker, x: these.map(({ i }) => d.values[i]),
        y: these.map(({ t }) => t.step_time_s), text: these.map(({ i }) => trialText(a, i)), hoverinfo: "text+y" });
    }
    for (const [name, oom] of [["out of memory", true], ["other failure (crash, timeout, refused)", false]]) {
      const these = failedOf(a, oom);
      traces.push({ ...on, name, legendgroup: name, mode: "markers", marker: FAILED_MARK[oom ? "oom" : "other"],
        x: these.map(({ i }) => d.values[i]), y: these.map(() => top), text: these.map(({ i }) => trialText(a, i)), hoverinfo: "text" });
    }
    layout[`xaxis${axis}`] = d.categorical ? { title: axisTitle(d.label), type: "category", categoryorder: "array", categoryarray: levelsOf(d) }
      : { title: axisTitle(d.label), type: "linear" };
    layout[`yaxis${axis}`] = { title: axisTitle(k % columns === 0 ? "step time (s)" : ""), type: logY ? "log" : "linear" };
  });
  Plotly.react("plot-slices", traces, layout, CONFIG);
}

function pairDefaults(a) {
  const ranked = a.importance.length ? a.importance[0].ranked.map((r) => r.label) : [];
  const labels = a.dimensions.map((d) => d.label);
  return [...ranked.filter((l) => labels.includes(l)), ...labels.filter((l) => !ranked.includes(l))];
}

function renderPairs(study) {
  const a = study.analysis;
  const pickX = document.getElementById("pair-x"), pickY = document.getElementById("pair-y");
  const labels = a.dimensions.map((d) => d.label);
  const ordered = pairDefaults(a);
  for (const [pick, fallback] of [[pickX, ordered[0]], [pickY, ordered[1]]]) {
    const keep = labels.includes(pick.value) && pick.dataset.chosen ? pick.value : fallback;
    pick.replaceChildren(...labels.map((l) => el("option", { value: l }, l)));
    if (keep !== undefined) pick.value = keep;
  }
  if (labels.length < 2 || !a.trials.length) { Plotly.purge("plot-pairs"); return; }
  const dx = a.dimensions[labels.indexOf(pickX.value)], dy = a.dimensions[labels.indexOf(pickY.value)];
  const cx = cellsOf(dx), cy = cellsOf(dy);
  const sums = cy.labels.map(() => cx.labels.map(() => [0, 0]));
  const measured = measuredOf(a);
  for (const { t, i } of measured) { const cell = sums[cy.index(i)][cx.index(i)]; cell[0] += t.step_time_s; cell[1] += 1; }
  const jitter = (k) => 0.12 * Math.sin(7.3 * k);  // several trials of one cell drawn apart
  const at = (these, c, d) => these.map(({ i }, k) => c.index(i) + jitter(k));
  const traces = [{
    type: "heatmap", name: "mean step time", x: cx.labels.map((_, k) => k), y: cy.labels.map((_, k) => k),
    z: sums.map((row) => row.map(([sum, n]) => (n ? sum / n : null))),
    text: sums.map((row) => row.map(([, n]) => `${n} measured`)),
    colorscale: "Viridis", colorbar: { title: { text: "mean step time (s)" } }, hoverongaps: false,
    hovertemplate: "mean step %{z:.4f} s (%{text})<extra></extra>",
  }, {
    mode: "markers", name: "measured trial", x: at(measured, cx), y: at(measured, cy).map((v, k) => v + jitter(k + 3)),
    text: measured.map(({ i }) => trialText(a, i)), hoverinfo: "text", marker: { color: "#fff", size: 6, line: { color: "#111827", width: 1 } },
  }];
  for (const [name, oom] of [["out of memory", true], ["other failure (crash, timeout, refused)", false]]) {
    const these = failedOf(a, oom);
    traces.push({ mode: "markers", name, x: at(these, cx), y: at(these, cy).map((v, k) => v + jitter(k + 3)),
      text: these.map(({ i }) => trialText(a, i)), hoverinfo: "text", marker: FAILED_MARK[oom ? "oom" : "other"] });
  }
  const axis = (d, c) => ({ title: axisTitle(d.label), tickvals: c.labels.map((_, k) => k), ticktext: c.labels,
    range: [-0.5, c.labels.length - 0.5], zeroline: false, showgrid: false });
  Plotly.react("plot-pairs", traces, { ...LAYOUT, height: 460, xaxis: axis(dx, cx), yaxis: axis(dy, cy),
    title: title(`${dx.label} × ${dy.label}: mean measured step time per cell (blank: never measured), failures marked`) }, CONFIG);
}

function trialVisible(t) {
  const kind = document.getElementById("filter-kind").value;
  const outcome = document.getElementById("filter-outcome").value;
  const text = document.getElementById("filter-text").value.trim().toLowerCase();
  if (kind && t.kind !== kind) return false;
  if (outcome === "ok" && t.outcome !== "ok") return false;
  if (outcome === "failed" && ["ok", "running", "proposed"].includes(t.outcome)) return false;
  if (outcome === "running" && !["running", "proposed"].includes(t.outcome)) return false;
  if (text && !`${t.trial_id} ${knobText(t.knobs)} ${t.patches.join(" ")} ${t.origin} ${t.outcome} ${t.failed_invariants.join(" ")}`.toLowerCase().includes(text)) return false;
  return true;
}

let lastStudy = null;
function renderTrials(study) {
  const before = seenTrials;
  seenTrials = new Set(study.trials.map((t) => t.trial_id));
  lastStudy = study;
  const shown = study.trials.filter(trialVisible);
  document.getElementById("trial-count").textContent =
    shown.length === study.trials.length ? `(${study.trials.length})` : `(${shown.length} of ${study.trials.length})`;
  fillBody("#trials-table", shown.map((t) => el("tr", {
      "data-trial": t.trial_id, class: before && !before.has(t.trial_id) ? "fresh" : "" },
    num(t.n), el("td", {}, el("code", {}, t.trial_id.slice(0, 14))), el("td", {}, t.kind), el("td", {}, t.origin),
    el("td", {}, knobText(t.knobs)), el("td", {}, t.patches.join(", ")), el("td", { title: t.reason }, badge(t.outcome), t.outcome === "running" && t.steps_seen !== null ? ` step ${t.steps_seen}` : ""),
    num(fmt(t.step_time_s)), num(fmt(t.predicted_step_time_s)), num(times(t.speedup)),
    num(gib(t.peak_bytes ?? t.censored_peak_bytes)), num(gib(t.predicted_peak_bytes)), num(fmt(t.predicted_p_oom, 2)),
    num(fmt(t.accelerator_s, 1)), el("td", {}, t.failed_invariants.join(", ")))));
}

function renderCost(study) {
  const outcomes = [...new Set(study.cost_by_outcome.map((c) => c.outcome))];
  const kinds = [...new Set(study.cost_by_outcome.map((c) => c.kind))];
  Plotly.react("plot-cost", outcomes.map((outcome) => ({
    type: "bar", name: outcome, x: kinds, marker: { color: OUTCOME_COLORS[outcome] || "#9ca3af" },
    y: kinds.map((kind) => (study.cost_by_outcome.find((c) => c.kind === kind && c.outcome === outcome) || { accelerator_hours: 0 }).accelerator_hours),
  })), { ...LAYOUT, barmode: "stack", title: title(`Accelerator-hours: ${fmt(study.accelerator_hours, 3)} in all, failed trials included`),
         yaxis: { title: axisTitle("accelerator-hours") } }, CONFIG);
}

function renderDoctor(study) {
  const facts = document.getElementById("doctor-facts");
  const doctor = study.doctor;
  if (!doctor) { facts.replaceChildren(el("p", { class: "muted" }, "The doctor has not completed yet.")); Plotly.purge("plot-doctor"); return; }
  const rows = [
    ["baseline step", `${fmt(doctor.baseline_step_time_s)} s`], ["run-to-run CV", `${fmt(100 * doctor.run_to_run_cv, 2)} %`],
    ["step-to-step CV", `${fmt(100 * doctor.step_to_step_cv, 2)} %`], ["warm-up steps", doctor.warmup_steps],
    ["smallest detectable speed-up", times(doctor.min_detectable_speedup)], ["repeats per trial", doctor.repeats_per_trial],
    ["baseline runs", doctor.repeats], ["stragglers", doctor.stragglers.length ? doctor.stragglers.join(", ") : "none"],
    ["phases", Object.entries(doctor.phase_fractions).map(([k, v]) => `${k} ${fmt(100 * v, 0)}%`).join(", ")],
  ];
  facts.replaceChildren(el("table", { class: "grid", id: "doctor-table" }, el("tbody", {}, ...rows.map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {}, v))))));
  const base = doctor.baseline_step_time_s;
  Plotly.react("plot-doctor", [
    { type: "box", name: "baseline runs", y: doctor.run_step_times_s, boxpoints: "all", jitter: 0.4, marker: { color: "#2563eb" } },
  ], { ...LAYOUT, title: title("Baseline step time per doctor run (band: ± run-to-run CV)"), yaxis: { title: axisTitle("step time (s)") },
       shapes: base ? [{ type: "rect", xref: "paper", x0: 0, x1: 1, y0: base * (1 - doctor.run_to_run_cv), y1: base * (1 + doctor.run_to_run_cv),
                         fillcolor: "#f59e0b", opacity: 0.15, line: { width: 0 } }] : [] }, CONFIG);
}

function renderVerify(study) {
  const rounds = study.verifications;
  const label = (v) => `${knobText(v.knobs)} ${v.patches.join(" ")}`.trim() || "baseline";
  Plotly.react("plot-verify", [{
    mode: "markers", x: rounds.map((v) => `${label(v)}<br>round ${v.round}`), y: rounds.map((v) => v.speedup),
    error_y: { type: "data", symmetric: false, array: rounds.map((v) => v.ci_high - v.speedup), arrayminus: rounds.map((v) => v.speedup - v.ci_low) },
    marker: { size: 10, color: rounds.map((v) => (v.failed_invariants.length ? "#db2777" : "#16a34a")) },
  }], { ...LAYOUT, title: title("Verified speed-up per round, 95% CI (pink: an invariant failed)"), yaxis: { title: axisTitle("speed-up") },
       shapes: [{ type: "line", xref: "paper", x0: 0, x1: 1, y0: 1, y1: 1, line: { color: "#9ca3af", dash: "dot" } }] }, CONFIG);
  fillBody("#verify-table", rounds.map((v) => el("tr", {},
    el("td", {}, label(v)), num(v.round), num(times(v.speedup)), el("td", {}, `${fmt(v.ci_low, 2)}–${fmt(v.ci_high, 2)}`),
    num(v.passes), el("td", {}, v.promotable ? "yes" : "no"), el("td", {}, v.failed_invariants.join(", ")))));
}

function renderInvariants(study) {
  fillBody("#invariants-table", study.invariants.map((inv) => el("tr", {},
    el("td", {}, el("code", {}, inv.name)), num(inv.held), num(inv.failed),
    el("td", {}, inv.failures.slice(0, 6).map((f) => `${f.trial_id} (${f.kind}): ${f.detail}`).join("; ") + (inv.failures.length > 6 ? " …" : "")))));
}

function renderAgent(study) {
  const list = document.getElementById("agent-list");
  if (!study.agent.length) { list.replaceChildren(el("p", { class: "muted" }, "No exchange with a language model in this study.")); return; }
  list.replaceChildren(...study.agent.map((x) => el("div", { class: "exchange" },
    el("div", {}, el("b", {}, `${x.purpose || "?"} · ${x.model || ""}`), " ", el("span", { class: "muted" }, x.asked_at || "")),
    el("pre", {}, x.question || ""),
    x.answered ? el("div", {}, `${x.ok ? "answered" : `no usable answer (${x.error})`} · ${x.tokens} tokens · $${fmt(x.cost_usd, 4)} · ${fmt(x.latency_s, 1)} s · `
      + `${x.candidates} candidates, patches: ${x.patches.join(", ") || "none"}, ${x.priors} priors`
      + (x.refused.length ? ` · refused: ${x.refused.join("; ")}` : "")) : el("div", { class: "muted" }, "waiting for the answer"),
    x.answered ? el("pre", {}, x.answer || x.detail || "") : null)));
}

async function refresh() {
  const studies = await getJSON("/api/studies");
  renderStudies(studies);
  document.getElementById("study").hidden = !selected;
  if (selected) {
    const study = await getJSON(`/api/studies/${encodeURIComponent(selected)}`);
    renderSummary(study); renderSearch(study); renderSpace(study); renderImportance(study); renderSlices(study);
    renderPairs(study); renderTrials(study); renderCost(study);
    renderDoctor(study); renderVerify(study); renderInvariants(study); renderAgent(study);
  }
  document.getElementById("updated").textContent = `updated ${new Date().toISOString().slice(11, 19)} UTC`;
  document.body.dataset.version = String(Number(document.body.dataset.version || 0) + 1);
}

let running = null, again = false;
function schedule() {
  if (running) { again = true; return; }
  running = refresh().catch((error) => { document.getElementById("updated").textContent = String(error); })
    .finally(() => { running = null; if (again) { again = false; schedule(); } });
}

async function follow() {
  const live = document.getElementById("live");
  const state = await getJSON("/api/state");
  if (!state.live) { live.textContent = "fixed file"; live.title = state.db; return; }
  const source = new EventSource("/api/stream");
  source.addEventListener("version", () => { live.textContent = "live"; live.className = "live on"; schedule(); });
  source.onerror = () => { live.textContent = "reconnecting…"; live.className = "live off"; };
}

for (const id of ["filter-kind", "filter-outcome", "filter-text"]) {
  for (const type of ["input", "change"]) {
    document.getElementById(id).addEventListener(type, () => { if (lastStudy) renderTrials(lastStudy); });
  }
}
for (const id of ["pair-x", "pair-y"]) {
  document.getElementById(id).addEventListener("change", (event) => {
    event.target.dataset.chosen = "1";
    if (lastStudy) renderPairs(lastStudy);
  });
}
schedule();
follow();
