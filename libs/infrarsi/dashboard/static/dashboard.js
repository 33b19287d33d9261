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
    document.getElementById("importance-interactions").textContent = "";
    Plotly.purge("plot-importance");
    return;
  }
  note.textContent = `Share of each target's variance carried by a knob's main effect, from an additive model fitted over `
    + `all knobs and patches at once (docs/dashboard.md); "unexplained" is the rest: interactions and noise. ${counts}.`;
  const pairs = a.interactions;
  document.getElementById("importance-interactions").textContent = pairs.ranked
    ? `Pairwise interactions (second order, ${pairs.trials} trials; each net of what its columns would fit of noise): `
      + pairs.ranked.map((r) => `${r.label} ${fmt(100 * r.share, 1)} %`).join(", ") + `; unexplained ${fmt(100 * pairs.unexplained, 1)} %.`
    : `Pairwise interactions: not estimated — ${pairs.reason}.`;
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

// The trials table: one column per knob the study's trials set (optuna-dashboard's params columns), sorted by any
// column in the page (``sortKey``, ``sortDir``: kept across live updates, so a new row lands where it sorts) and
// filtered by kind, outcome, origin, a knob's value, a patch and free text.
let sortKey = "n", sortDir = 1;
const GOLDEN = "golden";
const knobsOf = (trials) => [...new Set(trials.flatMap((t) => Object.keys(t.knobs)))].sort();
const knobValue = (t, knob) => (knob in t.knobs ? String(t.knobs[knob]) : GOLDEN);
const ratio = (measured, predicted) => (measured !== null && measured !== undefined && predicted) ? measured / predicted : null;
const studyLink = (studyId) => `?study=${encodeURIComponent(studyId)}`;
const trialLink = (studyId, trialId) => `${studyLink(studyId)}&trial=${encodeURIComponent(trialId)}`;

function trialColumns(study) {
  const knobColumns = knobsOf(study.trials).map((knob) => ({
    key: `knob:${knob}`, label: knob, value: (t) => (knob in t.knobs ? t.knobs[knob] : null),
    cell: (t) => (knob in t.knobs ? el("td", {}, String(t.knobs[knob])) : el("td", { class: "muted", title: "left at the golden value" }, "·")),
  }));
  return [
    { key: "n", label: "#", value: (t) => t.n, cell: (t) => num(t.n) },
    { key: "trial_id", label: "trial", value: (t) => t.trial_id,
      cell: (t) => el("td", {}, el("a", { class: "trial-link", href: trialLink(study.study_id, t.trial_id) }, el("code", {}, t.trial_id.slice(0, 14)))) },
    { key: "kind", label: "kind", value: (t) => t.kind, cell: (t) => el("td", {}, t.kind) },
    { key: "origin", label: "origin", value: (t) => t.origin, cell: (t) => el("td", {}, t.origin) },
    ...knobColumns,
    { key: "patches", label: "patches", value: (t) => t.patches.join(", ") || null, cell: (t) => el("td", {}, t.patches.join(", ")) },
    { key: "outcome", label: "outcome", value: (t) => t.outcome,
      cell: (t) => el("td", { title: t.reason }, badge(t.outcome), t.outcome === "running" && t.steps_seen !== null ? ` step ${t.steps_seen}` : "") },
    { key: "step_time_s", label: "step s", value: (t) => t.step_time_s, cell: (t) => num(fmt(t.step_time_s)) },
    { key: "predicted_step_time_s", label: "predicted s", value: (t) => t.predicted_step_time_s, cell: (t) => num(fmt(t.predicted_step_time_s)) },
    { key: "step_vs_predicted", label: "measured / predicted", value: (t) => ratio(t.step_time_s, t.predicted_step_time_s),
      cell: (t) => num(fmt(ratio(t.step_time_s, t.predicted_step_time_s), 2)) },
    { key: "speedup", label: "speed-up", value: (t) => t.speedup, cell: (t) => num(times(t.speedup)) },
    { key: "peak_bytes", label: "peak GiB", value: (t) => t.peak_bytes ?? t.censored_peak_bytes, cell: (t) => num(gib(t.peak_bytes ?? t.censored_peak_bytes)) },
    { key: "predicted_peak_bytes", label: "predicted GiB", value: (t) => t.predicted_peak_bytes, cell: (t) => num(gib(t.predicted_peak_bytes)) },
    { key: "predicted_p_oom", label: "P(OOM)", value: (t) => t.predicted_p_oom, cell: (t) => num(fmt(t.predicted_p_oom, 2)) },
    { key: "accelerator_s", label: "accelerator-s", value: (t) => t.accelerator_s, cell: (t) => num(fmt(t.accelerator_s, 1)) },
    { key: "failed_invariants", label: "failed invariants", value: (t) => t.failed_invariants.join(", ") || null,
      cell: (t) => el("td", {}, t.failed_invariants.join(", ")) },
  ];
}

// Empty values last whichever the direction; numbers by value, text in natural order; ties by proposal order.
function compareBy(column) {
  return (a, b) => {
    const x = column.value(a), y = column.value(b);
    const xNone = x === null || x === undefined, yNone = y === null || y === undefined;
    if (xNone || yNone) return xNone === yNone ? a.n - b.n : (xNone ? 1 : -1);
    const order = (typeof x === "number" && typeof y === "number") ? x - y
      : String(x).localeCompare(String(y), "en", { numeric: true });
    return order * sortDir || a.n - b.n;
  };
}

// A select's options rebuilt from the data, keeping what the user picked (a live update may add options).
// Left as they are when the values did not change, so that a live update does not pull an open list from under the user.
function setOptions(select, values, anyLabel) {
  const keep = select.value;
  if ([...select.options].slice(1).map((o) => o.value).join("\n") === values.join("\n")) return;
  select.replaceChildren(el("option", { value: "" }, anyLabel), ...values.map((v) => el("option", { value: v }, v)));
  select.value = values.includes(keep) ? keep : "";
}

function updateFilterOptions(study) {
  setOptions(document.getElementById("filter-origin"), [...new Set(study.trials.map((t) => t.origin).filter(Boolean))].sort(), "all");
  const knobSelect = document.getElementById("filter-knob");
  setOptions(knobSelect, knobsOf(study.trials), "any");
  const knob = knobSelect.value;
  const values = knob ? [...new Set(study.trials.map((t) => knobValue(t, knob)))]
    .sort((a, b) => a.localeCompare(b, "en", { numeric: true })) : [];
  setOptions(document.getElementById("filter-knob-value"), values, "any");
}

function trialVisible(t) {
  const value = (id) => document.getElementById(id).value;
  const kind = value("filter-kind"), outcome = value("filter-outcome"), origin = value("filter-origin");
  const knob = value("filter-knob"), knobIs = value("filter-knob-value");
  const patch = value("filter-patch").trim().toLowerCase(), text = value("filter-text").trim().toLowerCase();
  if (kind && t.kind !== kind) return false;
  if (outcome === "ok" && t.outcome !== "ok") return false;
  if (outcome === "failed" && ["ok", "running", "proposed"].includes(t.outcome)) return false;
  if (outcome === "running" && !["running", "proposed"].includes(t.outcome)) return false;
  if (origin && t.origin !== origin) return false;
  if (knob && knobIs && knobValue(t, knob) !== knobIs) return false;
  if (patch && !t.patches.some((p) => p.toLowerCase().includes(patch))) return false;
  if (text && !`${t.trial_id} ${knobText(t.knobs)} ${t.patches.join(" ")} ${t.origin} ${t.outcome} ${t.failed_invariants.join(" ")}`.toLowerCase().includes(text)) return false;
  return true;
}

let lastStudy = null;
function renderTrials(study) {
  const before = seenTrials;
  seenTrials = new Set(study.trials.map((t) => t.trial_id));
  lastStudy = study;
  updateFilterOptions(study);
  const columns = trialColumns(study);
  const column = columns.find((c) => c.key === sortKey) || columns[0];
  const header = document.querySelector("#trials-table thead tr");
  if ([...header.children].map((th) => th.dataset.sort).join(" ") !== columns.map((c) => c.key).join(" ")) {
    header.replaceChildren(...columns.map((c) => {  // rebuilt only when a knob column comes or goes
      const th = el("th", { "data-sort": c.key, class: "sortable", title: "sort by this column" }, c.label);
      th.addEventListener("click", () => {
        if (sortKey === c.key) sortDir = -sortDir; else { sortKey = c.key; sortDir = 1; }
        renderTrials(lastStudy);
      });
      return th;
    }));
  }
  for (const th of header.children) {
    th.classList.toggle("sorted-asc", th.dataset.sort === column.key && sortDir > 0);
    th.classList.toggle("sorted-desc", th.dataset.sort === column.key && sortDir < 0);
  }
  const shown = study.trials.filter(trialVisible).sort(compareBy(column));
  document.getElementById("trial-count").textContent =
    shown.length === study.trials.length ? `(${study.trials.length})` : `(${shown.length} of ${study.trials.length})`;
  fillBody("#trials-table", shown.map((t) => el("tr", {
    "data-trial": t.trial_id, class: before && !before.has(t.trial_id) ? "fresh" : "" }, ...columns.map((c) => c.cell(t)))));
}

// optuna-dashboard's history and EDF plots for the step time (views.history, views.step_time_edf).
function renderHistory(study) {
  const points = study.history;
  const measured = points.filter((p) => p.step_time_s !== null);
  const steps = measured.map((p) => p.step_time_s);
  const logY = stepAxisIsLog(steps);
  const top = steps.length ? Math.max(...steps) * (logY ? 1.6 : 1.15) : 1;
  const kinds = [...new Set(measured.map((p) => p.kind))];
  const marks = (these) => ({ x: these.map((p) => p.n), text: these.map((p) => `${p.trial_id} ${p.kind} ${p.outcome}`) });
  const traces = kinds.map((kind) => {
    const these = measured.filter((p) => p.kind === kind);
    return { name: kind, mode: "markers", ...marks(these), y: these.map((p) => p.step_time_s),
             marker: { size: 8, symbol: these.map((p) => (p.outcome === "ok" ? "circle" : "diamond-open")) } };
  });
  for (const [name, oom] of [["out of memory", true], ["other failure (crash, timeout, refused)", false]]) {
    const these = points.filter((p) => p.step_time_s === null && (p.outcome === "oom") === oom);
    traces.push({ name, mode: "markers", ...marks(these), y: these.map(() => top), marker: FAILED_MARK[oom ? "oom" : "other"] });
  }
  const best = points.filter((p) => p.best_step_s !== null);
  traces.push({ name: "best search trial so far", mode: "lines", line: { shape: "hv", color: "#16a34a", width: 2 },
                x: best.map((p) => p.n), y: best.map((p) => p.best_step_s) });
  const base = study.baseline_step_time_s;
  Plotly.react("plot-history", traces, { ...LAYOUT, title: title("Optimisation history: step time per trial (dotted: baseline; failed trials on top)"),
    xaxis: { title: axisTitle("trial #") }, yaxis: { title: axisTitle("step time (s)"), type: logY ? "log" : "linear" },
    shapes: base ? [{ type: "line", xref: "paper", x0: 0, x1: 1, y0: base, y1: base, line: { color: "#9ca3af", dash: "dot" } }] : [] }, CONFIG);

  Plotly.react("plot-edf", study.edf.map((e) => ({
    name: `${e.kind} (${e.step_time_s.length})`, mode: "lines+markers", line: { shape: "hv" }, x: e.step_time_s, y: e.fraction,
    text: e.trial_ids, hovertemplate: "%{text}: %{x:.4f} s, %{y:.0%} at or below<extra>%{fullData.name}</extra>",
  })), { ...LAYOUT, title: title("Empirical distribution of step times (trials that ran ok, per kind)"),
    xaxis: { title: axisTitle("step time (s)"), type: logY ? "log" : "linear" },
    yaxis: { title: axisTitle("fraction of trials at or below"), range: [0, 1.05] } }, CONFIG);
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

// A trial's own page (``?study=S&trial=T``): views.trial_detail.
const row2 = (label, ...cells) => el("tr", {}, el("th", {}, label), ...cells.map((c) => el("td", {}, c ?? "")));

function renderTrialPage(detail) {
  const t = detail.trial, p = detail.proposal.prediction || {}, m = detail.measured, f = detail.finish, l = detail.launch;
  document.getElementById("trial-back").setAttribute("href", studyLink(detail.study_id));
  document.getElementById("trial-back").textContent = `← ${detail.study_name} (${detail.study_id.slice(0, 12)})`;
  document.getElementById("trial-title").replaceChildren(`Trial ${t.trial_id} (#${t.n}) `, badge(t.outcome));
  fillBody("#trial-candidate", [
    row2("kind", t.kind), row2("origin", t.origin), row2("proposer's reason", detail.proposal.reason || ""),
    ...Object.entries(t.knobs).map(([k, v]) => el("tr", { class: "knob", "data-knob": k }, el("th", {}, `knob ${k}`), el("td", {}, String(v)))),
    row2("patches", t.patches.join(", ") || "none"), row2("candidate key", t.candidate_key),
    row2("repeat", t.repeat), row2("verification", t.verify_id || ""), row2("horizon steps", detail.proposal.horizon_steps ?? ""),
  ]);
  const oomHappened = t.outcome === "oom" ? "yes" : (["proposed", "running"].includes(t.outcome) ? "" : "no");
  fillBody("#trial-prediction", [
    el("tr", { "data-row": "step" }, el("th", {}, "step time (s)"), num(fmt(p.step_time_s, 4)), num(fmt(m.step_time_s, 4)),
       num(fmt(ratio(m.step_time_s, p.step_time_s), 3))),
    el("tr", { "data-row": "peak" }, el("th", {}, "peak memory (GiB)"), num(gib(p.peak_memory_bytes, 3)),
       num(gib(t.peak_bytes ?? t.censored_peak_bytes, 3)), num(fmt(ratio(t.peak_bytes ?? t.censored_peak_bytes, p.peak_memory_bytes), 3))),
    el("tr", { "data-row": "oom" }, el("th", {}, "P(OOM) · ran out of memory"), num(fmt(p.p_oom, 3)), el("td", { class: "num" }, oomHappened), el("td")),
    el("tr", { "data-row": "speedup" }, el("th", {}, "speed-up"), num(p.step_time_s && detail.baseline_step_time_s ? times(detail.baseline_step_time_s / p.step_time_s) : ""),
       num(times(t.speedup)), el("td")),
  ]);
  fillBody("#trial-run", [
    row2("outcome", t.outcome), row2("failure reason", f.finish_reason || t.reason || ""), row2("exit code", f.exit_code ?? ""),
    row2("where", [l.backend, l.host, l.job_id && `job ${l.job_id}`].filter(Boolean).join(" · ")),
    row2("nodes × ranks", l.nodes ? `${l.nodes} × ${l.ranks}` : ""), row2("wall s", fmt(f.wall_s, 1)),
    row2("accelerator-s", fmt(f.accelerator_s ?? t.accelerator_s, 1)), row2("steps completed", f.steps_completed ?? ""),
    row2("measured steps (warm-up)", m.measured_steps ? `${m.measured_steps} (${m.warmup_steps})` : ""),
    row2("step time ± MAD (s)", m.step_time_s ? `${fmt(m.step_time_s, 4)} ± ${fmt(m.step_time_mad_s, 4)}` : ""),
    row2("MFU", m.mfu ? `${fmt(100 * m.mfu, 2)} %` : ""), row2("tokens/s", fmt(m.tokens_per_s, 0)),
    row2("final loss", fmt(m.final_loss, 4)),
    row2("peak per rank (GiB)", m.peak_memory_per_rank.map((b) => gib(b, 2)).join(", ")),
    row2("censored peak (GiB: killed above)", gib(f.censored_peak_bytes, 2)),
  ]);
  fillBody("#trial-invariants", t.invariants.map((v) => el("tr", {}, el("td", {}, el("code", {}, v.name)),
    el("td", {}, v.ok ? "held" : "failed"), el("td", {}, v.detail || ""))));

  // optuna-dashboard's intermediate values: the probe's per-step times, per rank, with the loss beside them.
  const traces = detail.steps.map((r) => ({ name: `step time, rank ${r.rank}`, mode: "lines+markers", x: r.step, y: r.step_time_s,
                                            marker: { size: 5 } }));
  const rank0 = detail.steps.find((r) => r.rank === 0) || detail.steps[0];
  const loss = rank0 && rank0.loss.some((v) => v !== null) ? { x: rank0.step, y: rank0.loss, name: "loss (probe, rank " + rank0.rank + ")" }
    : detail.loss_curve.length ? { x: detail.loss_curve.map((pt) => pt[0]), y: detail.loss_curve.map((pt) => pt[1]), name: "loss (measured curve)" } : null;
  if (loss) traces.push({ ...loss, mode: "lines", yaxis: "y2", line: { color: "#9333ea", dash: "dot" } });
  document.getElementById("trial-steps-note").textContent = detail.steps.length
    ? `${rank0.step.length} step(s) reported by rank ${rank0.rank}'s probe, ${detail.steps.length} rank(s).`
    : "No per-step record of this trial in the analyst DB (its probe reported none on the telemetry stream).";
  if (!traces.length) { Plotly.purge("plot-trial-steps"); return; }
  Plotly.react("plot-trial-steps", traces, { ...LAYOUT, margin: { ...LAYOUT.margin, r: 60 }, title: title("Per-step time (and loss) as the trial ran"),
    xaxis: { title: axisTitle("step") }, yaxis: { title: axisTitle("step time (s)") },
    yaxis2: { title: axisTitle("loss"), overlaying: "y", side: "right", showgrid: false } }, CONFIG);
}

async function refresh() {
  const studies = await getJSON("/api/studies");
  renderStudies(studies);
  const trialId = params.get("trial");
  document.getElementById("study").hidden = !selected || Boolean(trialId);
  document.getElementById("trial-page").hidden = !(selected && trialId);
  if (selected && trialId) {
    const missing = document.getElementById("trial-missing");
    try {
      renderTrialPage(await getJSON(`/api/studies/${encodeURIComponent(selected)}/trials/${encodeURIComponent(trialId)}`));
      missing.hidden = true;
    } catch (error) {
      missing.hidden = false; missing.textContent = String(error);
    }
  } else if (selected) {
    const study = await getJSON(`/api/studies/${encodeURIComponent(selected)}`);
    renderSummary(study); renderSearch(study); renderHistory(study); renderSpace(study); renderImportance(study); renderSlices(study);
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

for (const id of ["filter-kind", "filter-outcome", "filter-origin", "filter-knob", "filter-knob-value", "filter-patch", "filter-text"]) {
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
