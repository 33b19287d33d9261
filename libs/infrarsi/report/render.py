"""Renderers: one document outline (``outline``), three formats (HTML, Markdown, PDF).

``outline(report)`` turns a ``Report`` into a list of blocks (headings, paragraphs, tables, figures, code);
each renderer only lays the blocks out, so the three formats say the same thing:

- HTML: one self-contained file, plots inline as base64 PNG;
- Markdown: ``report.md`` with the plots as PNG files beside it;
- PDF: matplotlib ``PdfPages`` — text pages (tables as monospaced text) then one page per plot; no extra deps.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.backends.backend_pdf import PdfPages  # noqa: E402

from infrarsi.report.figures import FIGURES  # noqa: E402
from infrarsi.report.model import OUTCOMES, Report, TrialRow  # noqa: E402
from infrarsi.study.contract import Contract  # noqa: E402
from infrarsi.verdicts import verification as vf  # noqa: E402

# --------------------------------------------------------------------------------------------------
# Blocks
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Heading:
    text: str
    level: int = 2


@dataclass(frozen=True)
class Para:
    text: str


@dataclass(frozen=True)
class Table:
    header: list[str]
    rows: list[list[str]]


@dataclass(frozen=True)
class Figure:
    name: str
    caption: str


@dataclass(frozen=True)
class Code:
    text: str
    caption: str = ""


Block = Heading | Para | Table | Figure | Code


def _ms(s: float | None) -> str:
    return "—" if s is None else f"{s * 1e3:.2f} ms"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x:.1%}"


def _ratio(log_ratio: float | None) -> str:
    """A log-ratio of step time as the factor it multiplies the step by (×0.90 = 10% faster)."""
    return "—" if log_ratio is None else f"×{math.exp(log_ratio):.3f}"


def _draft_blocks(report: Report) -> list[Block]:
    """How the contract began, when ``init --ask`` drafted it: the request, the model's words, the cost."""
    d = report.contract_draft
    if d is None:
        return []
    note = f" Note: {d.note}." if d.note else ""
    return [Para(f"Drafted by a language model (init --ask, model {d.model or '(from the environment)'}, {d.tokens} "
                 f"tokens, ${d.cost_usd:.4f}) and accepted by the user. The request: \"{d.request}\". The model's "
                 f"reason: {d.reason or '(none given)'}.{note} The prompt and answer are in the log (AgentAsked/"
                 "AgentAnswered, purpose contract).")]


def _agent_blocks(report: Report) -> list[Block]:
    """What the study's language model was asked, said and cost, and what the gates and the invariants made of
    its diffs — in its own words beside the measurements."""
    a = report.agent
    if a is None:
        return []
    failed = ", ".join(f"{k} {n}" for k, n in sorted(a.failed.items())) or "none"
    blocks: list[Block] = [Heading("The agent"), Para(
        f"Model {a.model or '(from the environment)'}: {a.exchanges} exchange(s), {a.tokens} of {a.budget_tokens} tokens "
        f"(budget.llm_tokens), ${a.cost_usd:.4f}; exchanges without a usable answer: {failed}. Every prompt and answer "
        "is in the log (AgentAsked/AgentAnswered; the DuckDB view agent_exchanges).")]
    if a.patches:
        blocks.append(Table(
            ["patch", "the model's description and reason", "expected step time", "measured best / baseline",
             "trials", "failed invariants", "verdict"],
            [[r.patch_id, " — ".join(x for x in (r.description, r.reason) if x) or "—", _ratio(r.expected_time_log_ratio),
              "—" if r.best_step_ratio is None else f"×{r.best_step_ratio:.3f}", str(r.trials),
              ", ".join(r.failed_invariants) or "none", r.verdict] for r in a.patches]))
    if a.candidates:
        blocks.append(Table(["candidate", "the model's reason"], [[k, why or "—"] for k, why in a.candidates]))
    if a.refusals:
        blocks.append(Heading("Refused parts of the answers", 3))
        blocks.append(Table(["refused as", "item", "detail"], [list(r) for r in a.refusals]))
    return blocks


def topology(report: Report) -> str:
    """The scale the numbers were measured at: the cluster, and the ranks each trial ran."""
    cluster, launcher = report.cluster, report.contract.workload.launcher
    capacity = (report.memory_capacity_bytes or 0) / 1024**3
    return (f"{cluster.nodes} node(s) × {cluster.devices_per_node} {cluster.accelerator} device(s) "
            f"({cluster.interconnect}), {capacity:.3g} GiB per device; each trial "
            f"{launcher.nnodes} node(s) × {launcher.nproc_per_node} rank(s) ({launcher.kind})")


def _knob_text(knobs: dict[str, object]) -> str:
    return ", ".join(f"{k.rsplit('.', 1)[-1]}={json.dumps(v)}" for k, v in sorted(knobs.items())) or "golden"


def _trial_blocks(report: Report) -> list[Block]:
    """The per-trial table: what ran, how it ended, what it measured and cost."""
    if not report.trials:
        return [Heading("Trials", 3), Para("No trial ran.")]
    rows = []
    for t in report.trials:
        why = ", ".join(t.failed_invariants) or t.reason
        rows.append([str(t.order + 1), t.trial_id[:12], t.kind, t.origin, _knob_text(t.knobs),
                     ", ".join(t.patches) or "—", t.outcome or "running", _ms(t.step_time_s),
                     f"{t.peak_memory_bytes / 1024**3:.3g} GiB" if t.peak_memory_bytes else "—",
                     f"{t.accelerator_s:.1f}", why[:80] or "—"])
    return [Heading("Trials", 3), Para(f"Measured at {topology(report)}."),
            Table(["#", "trial", "kind", "origin", "knobs", "patches", "outcome", "step", "peak", "accel-s",
                   "why"], rows)]


def _promotion_blocks(report: Report) -> list[Block]:
    """Promoted branches and where they stand on the main line (``infrarsi follow``, ``infrarsi smoke``)."""
    if not report.promotions:
        return []
    rows = []
    for p in report.promotions:
        smoke = "—" if p.smoke is None else p.smoke.verdict
        where = p.state if not p.mainline else f"{p.state} ({p.mainline})"
        rows.append([p.branch, p.commit[:12], where, (p.merge_commit or "—")[:12], (p.revert_commit or "—")[:12],
                     smoke])
    return [Heading("Promoted branches"),
            Table(["branch", "commit", "state", "merged by", "reverted by", "smoke run"], rows)]


def outline(report: Report) -> list[Block]:
    c = report.contract
    wl, inv, loss, cluster = c.workload, c.invariants, c.invariants.loss, report.cluster
    blocks: list[Block] = [
        Heading(f"InfraRSI report — {report.name} ({report.study_id})", 1),
        Para(report.goal),
    ]
    # Summary
    blocks.append(Heading("Summary"))
    if report.winners:
        best = max(report.winners, key=lambda v: v.speedup)
        blocks.append(Para(
            f"{len(report.winners)} verified winner(s). Best: ×{best.speedup:.3f} "
            f"(95% CI {best.ci_low:.3f}–{best.ci_high:.3f}), step {_ms(best.baseline_step_s)} → {_ms(best.candidate_step_s)}, "
            f"MFU {_pct(best.mfu_before)} → {_pct(best.mfu_after)}."
        ))
    else:
        blocks.append(Para("No candidate passed verification; nothing is promotable."))
    blocks.append(Para(
        f"{len(report.trials)} trials, {report.accelerator_hours:.4g} accelerator-hours in total (failed trials included). "
        f"Baseline step time {_ms(report.baseline_step_s)}."
    ))
    blocks.append(Para(f"Topology: {topology(report)}. Every figure in this report holds at this scale only: the same "
                       "knobs may run out of memory, or lose their speed-up, on another device count, interconnect "
                       "or memory capacity."))
    coarse = [t for t in report.trials if t.coarse]
    if coarse:
        unchecked = sorted({u for t in coarse for u in t.unchecked_invariants})
        blocks.append(Para(
            f"COARSE MEASUREMENT: {len(coarse)} of {len(report.trials)} trials were measured from outside the job (it "
            "reports no steps to InfraRSI's probe): wall time, exit status, process-tree memory and the steps counted "
            f"in its output. UNCHECKED invariants (never counted as held): {', '.join(unchecked) or 'none'}. "
            "Step times are the launcher's estimates; tokens/s and MFU are unknown."
            + _loss_source(coarse)
        ))
    probed = [t for t in report.trials if not t.coarse and t.unchecked_invariants]
    if probed:
        counts: dict[str, int] = {}
        for t in probed:
            for u in t.unchecked_invariants:
                counts[u] = counts.get(u, 0) + 1
        blocks.append(Para(
            "UNCHECKED invariants on probe-measured trials (never counted as held): "
            + ", ".join(f"{name} on {n} trial(s)" for name, n in sorted(counts.items()))
            + " — too few steady steps to hold the probe's clock against the launcher's, or no loss checkpoint "
            "in both runs."
        ))
    # Contract
    blocks.append(Heading("Contract"))
    blocks += _draft_blocks(report)
    blocks.append(Table(["field", "value"], [
        ["workload", f"{wl.repo} @ {report.baseline_ref[:12]}"],
        ["command", " ".join(wl.command)],
        ["horizon", f"{wl.steps} steps (verify: {wl.verify_steps})"],
        ["cluster", f"{cluster.cluster_id} · {cluster.accelerator} · "
                    f"{cluster.nodes}×{cluster.devices_per_node} devices · "
                    f"capacity {(report.memory_capacity_bytes or 0) / 1024**3:.3g} GiB"],
        ["editable files", ", ".join(c.scope.files) or "—"],
        ["launch keys", ", ".join(c.scope.launch_keys) or "—"],
        ["knobs", ", ".join(sorted(c.search_space.knobs)) or "—"],
        ["patches", ", ".join(c.search_space.patches) or "—"],
        ["loss invariant", f"{loss.mode} ε={loss.tolerance} at {loss.at}"],
        ["loss trend (verify)", "off" if loss.trend is None else
         f"gap/ε fitted over the horizon must stay ≤ 1 at {loss.trend.horizon_multiple:g}× verify_steps "
         f"unless its slope is insignificant (one-sided p ≥ {loss.trend.alpha:g}); unchecked under "
         f"{loss.trend.min_points} compared steps"],
        ["numeric parity (verify)", {"none": "none", "bitwise": "bitwise: identical loss trajectory, deterministic "
                                     "algorithms on (INFRARSI_DETERMINISTIC)",
                                     "tight": f"tight: |Δ| ≤ {inv.parity_tight.max_abs:g} + "
                                              f"{inv.parity_tight.max_rel:g}·|baseline| at every step"}[inv.parity]],
        ["work invariants", f"steps={inv.steps} tokens={inv.tokens} eval={inv.eval}; "
                            f"timing tolerance {inv.timing_tolerance}"],
        ["checkpoint restart (verify)", _restart_line(c)],
        ["downstream (verify)", _downstream_line(c)],
        ["budget", f"{c.budget.trials} trials, {c.budget.accelerator_hours} accelerator-hours"],
        ["verify", f"top {c.verify.top_k}, {c.verify.repeats} interleaved pairs, {c.verify.passes_required} passes"],
        ["verify cost (predicted)", "unknown until the doctor measures a step time" if report.doctor is None
         else vf.predicted_verify_cost(c, report.doctor.step_time_s).line().removeprefix("verify cost (predicted, at most): ")
         + " at most"],
    ]))
    # Winners and verdicts
    blocks.append(Heading("Verified candidates"))
    if report.verdicts:
        blocks.append(Table(
            ["candidate", "verdict", "speed-up", "95% CI", "step before → after", "MFU before → after", "rounds",
             "failed invariants", "unchecked invariants"],
            [[v.candidate_key, "PROMOTABLE" if v.promotable else "rejected", f"×{v.speedup:.3f}",
              f"{v.ci_low:.3f}–{v.ci_high:.3f}", f"{_ms(v.baseline_step_s)} → {_ms(v.candidate_step_s)}",
              f"{_pct(v.mfu_before)} → {_pct(v.mfu_after)}", f"{v.passes}/{v.rounds} passed",
              ", ".join(v.failed_invariants) or "none", ", ".join(v.unchecked_invariants) or "none"]
             for v in report.verdicts],
        ))
        blocks.append(Heading("Invariant verdicts", 3))
        rows = []
        for v in report.verdicts:
            for i in v.invariants:
                rows.append([v.candidate_key, i.name, "ok" if i.ok else "FAIL", i.detail])
            for name in v.unchecked_invariants:
                rows.append([v.candidate_key, name, "UNCHECKED", "no run of the round could check it"])
        blocks.append(Table(["candidate", "invariant", "verdict", "detail"], rows))
    else:
        blocks.append(Para("No verification ran."))
    if report.invariant_failures:
        blocks.append(Para("Invariant failures over all measured runs: "
                           + ", ".join(f"{k}: {n}" for k, n in sorted(report.invariant_failures.items()))))
    # Audit trail
    blocks.append(Heading("Audit trail"))
    if not report.winners:
        blocks.append(Para("Nothing to audit: no winner."))
    for v in report.winners:
        blocks.append(Heading(f"Winner {v.candidate_key}", 3))
        blocks.append(Table(["what", "changes"], [
            ["launch keys", ", ".join(f"{k}={json.dumps(val)}" for k, val in sorted(v.knobs.items())) or "none"],
            ["git paths", ", ".join(v.files_changed) or "none"],
            ["patches", ", ".join(p.patch_id + ("" if p.found else " (diff not found)") for p in v.patches) or "none"],
            ["verify trials", ", ".join(v.trial_ids)],
        ]))
        if v.patches:
            blocks.append(Table(["patch", "proposed by", "their words", "expected step time", "measured (model)"], [
                [p.patch_id, p.proposed_by, p.reason or "—", _ratio(p.expected_time_log_ratio),
                 _ratio(p.measured_time_log_ratio)] for p in v.patches]))
        for p in v.patches:
            if p.found:
                blocks.append(Code(p.diff, f"{p.patch_id}.patch"))
    blocks += _agent_blocks(report)
    blocks += _promotion_blocks(report)
    # Cost
    blocks.append(Heading("Cost"))
    blocks.append(Table(["outcome", "trials", "accelerator-hours"],
                        [[o, str(report.trials_by_outcome[o]), f"{report.cost_by_outcome[o]:.4g}"] for o in OUTCOMES]
                        + [["total", str(sum(report.trials_by_outcome.values())), f"{report.accelerator_hours:.4g}"]]))
    blocks.append(Figure("cost", FIGURES["cost"][0]))
    # Search
    blocks.append(Heading("Search"))
    blocks.append(Figure("best_speedup", FIGURES["best_speedup"][0]))
    blocks.append(Figure("time_vs_memory", FIGURES["time_vs_memory"][0]))
    blocks += _trial_blocks(report)
    # Model
    blocks.append(Heading("Priors vs posteriors"))
    if report.model:
        m = report.model
        blocks.append(Para(f"Last model fit over {m.n_trials} trials ({m.n_oom} OOM, censored); "
                           f"noise σ(log) {m.noise_std_log:.4f}."))
        for label, effects in (("time (log-ratio of step time)", m.time_effects),
                               ("memory (log-ratio of peak)", m.memory_effects)):
            if effects:
                blocks.append(Heading(f"Effects on {label}", 3))
                blocks.append(Table(["feature", "prior", "posterior", "source"], [
                    [e.feature, f"{e.prior_mean:+.3f} ± {e.prior_std:.3f}",
                     f"{e.post_mean:+.3f} ± {e.post_std:.3f}", e.source] for e in effects]))
    else:
        blocks.append(Para("No model update in the log."))
    # Doctor appendix
    blocks.append(Heading("Appendix: doctor"))
    d = report.doctor
    if d:
        blocks.append(Table(["measure", "value"], [
            ["baseline runs", str(d.repeats)],
            ["step time (median of runs)", _ms(d.step_time_s)],
            ["warm-up", f"{d.warmup_steps} steps"],
            ["run-to-run CV", _pct(d.run_to_run_cv)],
            ["step-to-step CV", _pct(d.step_to_step_cv)],
            ["min detectable speed-up", f"×{d.min_detectable_speedup:.3f} at {d.repeats_per_trial} repeats"],
            ["repeats for effect", ", ".join(f"×{k}: {n}" for k, n in d.repeats_for_effect.items())],
            ["phases", ", ".join(f"{k} {v:.0%}" for k, v in d.phase_fractions.items()) or "—"],
            ["per-rank step", ", ".join(_ms(t) for t in d.per_rank_step_s)],
            ["stragglers", ", ".join(map(str, d.stragglers)) or "none"],
            ["peak FLOP/s (measured)", f"{d.peak_flops_measured:.3g}" if d.peak_flops_measured else "—"],
            ["MFU", _pct(d.mfu)],
        ]))
    else:
        blocks.append(Para("Doctor did not run."))
    blocks.append(Figure("noise", FIGURES["noise"][0]))
    blocks.append(Para("Built from events: " + ", ".join(f"{k} {n}" for k, n in report.generated_from.items())))
    return blocks


def _png(report: Report, name: str) -> bytes:
    fig = FIGURES[name][1](report)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


# --------------------------------------------------------------------------------------------------
# HTML
# --------------------------------------------------------------------------------------------------

_CSS = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#212529}
table{border-collapse:collapse;margin:.5em 0 1em}td,th{border:1px solid #dee2e6;padding:.25em .5em;font-size:.9em;text-align:left}
th{background:#f1f3f5}pre{background:#f8f9fa;padding:.75em;overflow-x:auto;font-size:.8em}figure{margin:1em 0}"""


def render_html(report: Report, path: Path) -> Path:
    e = html.escape
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{e(report.name)} — InfraRSI</title>"
             f"<style>{_CSS}</style></head><body>"]
    for b in outline(report):
        match b:
            case Heading(text, level):
                parts.append(f"<h{level}>{e(text)}</h{level}>")
            case Para(text):
                parts.append(f"<p>{e(text)}</p>")
            case Table(header, rows):
                parts.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in header) + "</tr>"
                             + "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in rows) + "</table>")
            case Figure(name, caption):
                data = base64.b64encode(_png(report, name)).decode()
                parts.append(f"<figure><img alt='{e(caption)}' src='data:image/png;base64,{data}'>"
                             f"<figcaption>{e(caption)}</figcaption></figure>")
            case Code(text, caption):
                parts.append(f"<p><code>{e(caption)}</code></p><pre>{e(text)}</pre>")
    parts.append("</body></html>")
    path.write_text("\n".join(parts))
    return path


# --------------------------------------------------------------------------------------------------
# Markdown
# --------------------------------------------------------------------------------------------------


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(report: Report, path: Path) -> list[Path]:
    """``report.md`` plus one PNG per plot beside it; returns every file written."""
    written = [path]
    lines: list[str] = []
    for b in outline(report):
        match b:
            case Heading(text, level):
                lines += ["#" * level + " " + text, ""]
            case Para(text):
                lines += [text, ""]
            case Table(header, rows):
                lines.append("| " + " | ".join(map(_md_cell, header)) + " |")
                lines.append("|" + "---|" * len(header))
                lines += ["| " + " | ".join(map(_md_cell, r)) + " |" for r in rows]
                lines.append("")
            case Figure(name, caption):
                image = path.with_name(f"{path.stem}-{name}.png")
                image.write_bytes(_png(report, name))
                written.append(image)
                lines += [f"![{caption}]({image.name})", ""]
            case Code(text, caption):
                lines += [f"`{caption}`", "", "```diff", text.rstrip("\n"), "```", ""]
    path.write_text("\n".join(lines))
    return written


# --------------------------------------------------------------------------------------------------
# PDF
# --------------------------------------------------------------------------------------------------

_PAGE_LINES = 62
_PAGE_COLS = 110


def _text_lines(blocks: list[Block]) -> list[tuple[str, str]]:
    """(style, line) pairs: the text part of the document, tables as fixed-width columns."""
    out: list[tuple[str, str]] = []
    for b in blocks:
        match b:
            case Heading(text, level):
                out += [("", ""), ("h" if level <= 2 else "h3", text)]
            case Para(text):
                out += [("p", line) for line in textwrap.wrap(text, _PAGE_COLS)] + [("", "")]
            case Table(header, rows):
                widths = [min(40, max(len(str(r[i])) for r in [header, *rows])) for i in range(len(header))]
                for r in [header, *rows]:
                    line = "  ".join(str(c)[:w].ljust(w) for c, w in zip(r, widths, strict=True))
                    out.append(("t", line[:_PAGE_COLS]))
                out.append(("", ""))
            case Code(text, caption):
                out.append(("p", caption))
                out += [("t", line[:_PAGE_COLS]) for line in text.splitlines()]
                out.append(("", ""))
            case Figure(_, caption):
                out.append(("p", f"[figure: {caption} — see its page]"))
    return out


def render_pdf(report: Report, path: Path) -> Path:
    blocks = outline(report)
    lines = _text_lines(blocks)
    styles: dict[str, dict[str, Any]] = {
        "h": dict(size=12, weight="bold"), "h3": dict(size=10, weight="bold"), "p": dict(size=8),
        "t": dict(size=6.5, family="monospace"), "": dict(size=8),
    }  # fmt: skip
    with PdfPages(path) as pdf:
        for start in range(0, len(lines), _PAGE_LINES):
            fig = plt.figure(figsize=(8.27, 11.69))  # A4
            for i, (style, text) in enumerate(lines[start : start + _PAGE_LINES]):
                fig.text(0.06, 0.96 - i * 0.0148, text, va="top", **styles[style])
            pdf.savefig(fig)
            plt.close(fig)
        for b in blocks:
            if isinstance(b, Figure):
                fig = FIGURES[b.name][1](report)
                pdf.savefig(fig)
                plt.close(fig)
        info = pdf.infodict()
        info["Title"] = f"InfraRSI report {report.study_id}"
    return path


def render_all(report: Report, out_dir: Path, formats: tuple[str, ...] = ("html", "md", "pdf")) -> list[Path]:
    """Write the report in every format into ``out_dir``; returns every file written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files: list[Path] = []
    if "html" in formats:
        files.append(render_html(report, out_dir / "report.html"))
    if "md" in formats:
        files += render_markdown(report, out_dir / "report.md")
    if "pdf" in formats:
        files.append(render_pdf(report, out_dir / "report.pdf"))
    return files


def _loss_source(coarse: list[TrialRow]) -> str:
    """Where a coarse study's checked loss came from: the job's printed output, never a probe."""
    logged = [t for t in coarse if t.loss_from_log]
    if not logged:
        return ""
    return (f" The LOSS of {len(logged)} of these trials was READ FROM THE JOB'S LOG (its printed train/eval loss, "
            "matched by the default patterns or workload.measurement.loss_regex) and checked against the golden "
            "baseline's printed loss.")  # fmt: skip


def _restart_line(c: Contract) -> str:
    restart = c.verify.checkpoint_restart
    if restart is None:
        return "off"
    across = "; also the baseline's checkpoint under the candidate (across_change)" if restart.across_change else ""
    return (f"a fresh process resumes the candidate run's checkpoint after {restart.step_for(c.workload.verify_steps)} "
            f"steps; its loss must stay within ε of the uninterrupted run{across}")


def _downstream_line(c: Contract) -> str:
    spec = c.verify.downstream
    if spec is None:
        return "off"
    limit = f"{spec.tolerance:.2%}" if spec.mode == "relative" else f"{spec.tolerance:g} ({spec.mode})"
    better = "higher" if spec.higher_is_better else "lower"
    return f"`{' '.join(spec.command)}` → {spec.metric} ({better} is better), at most {limit} worse than the baseline"
