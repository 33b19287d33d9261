"""What each view of the dashboard shows, read from the analyst DuckDB (docs/analytics.md's tables).

Every function takes an open DuckDB connection (a cursor of its own per request: DuckDB serves concurrent
readers of one database through separate cursors) and returns plain values the app encodes as JSON. Nothing
here writes, reads the bus, or knows about HTTP. Numbers are the log's: a step time is ``TrialMeasured``'s
robust centre, cost is ``TrialFinished.accelerator_s``, a speed-up is the doctor's baseline step time over the
trial's.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

import duckdb

from infrarsi.dashboard import importance

STAGES: dict[str, str] = {
    "StudyCreated": "init",
    "DoctorRequested": "doctor",
    "DoctorCompleted": "doctor done",
    "RunRequested": "run",
    "StudyFinished": "search done",
    "VerifyRequested": "verify",
    "VerifyCompleted": "verify",
    "ReportPublished": "reported",
    "ApprovalGranted": "approved",
    "PatchPromoted": "applied",
}
"""The event types that move a study from one stage to the next, and the stage each leaves it in: a study is
in the stage of its latest such event (by stream sequence), whatever order the services wrote them in."""


class UnknownStudy(LookupError):
    """No study with that id in the analyst DB."""


class UnknownTrial(LookupError):
    """No trial with that id in the study."""


def _rows(con: duckdb.DuckDBPyConnection, sql: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    cursor = con.execute(sql, params or {})
    names = [d[0] for d in cursor.description or ()]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def _json(value: Any) -> Any:
    """A DuckDB JSON column arrives as text; ``None`` stays ``None``."""
    return json.loads(value) if isinstance(value, str) else value


def _columns(row: Mapping[str, Any], *names: str) -> dict[str, Any]:
    """The named columns of a query row, as they are."""
    return {name: row[name] for name in names}


def _iso(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def stage_of(milestones: list[str], running_trials: int) -> str:
    """The study's stage from its milestone event types in stream order (``STAGES``), with what is running."""
    stage = STAGES.get(milestones[-1], "init") if milestones else "init"
    if running_trials:
        stage += f" · {running_trials} running"
    return stage


def studies(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """Every study, newest first: its stage, trials, cost and best speed-up so far."""
    rows = _rows(
        con,
        f"""
        WITH milestones AS (
            SELECT study_id, list(type ORDER BY seq) AS types
            FROM lifecycle_events WHERE type IN ({", ".join(f"'{t}'" for t in STAGES)})
            GROUP BY study_id
        ), per_study AS (
            SELECT study_id,
                   count(*) AS trials,
                   count(*) FILTER (WHERE launched_at IS NOT NULL AND finished_at IS NULL AND measured_at IS NULL) AS running,
                   count(*) FILTER (WHERE finish_status IS NOT NULL AND finish_status <> 'ok') AS failed,
                   coalesce(sum(accelerator_s), 0) AS accelerator_s,
                   min(step_time_s) FILTER (WHERE kind = 'search' AND status = 'ok' AND invariants_ok IS NOT FALSE) AS best_step_s
            FROM trials GROUP BY study_id
        ), verified AS (
            SELECT study_id, max(ci_low) FILTER (WHERE promotable) AS best_verified_ci_low,
                   arg_max(speedup, ci_low) FILTER (WHERE promotable) AS best_verified_speedup
            FROM verifications GROUP BY study_id
        )
        SELECT s.study_id, s.name, s.goal, s.accelerator, s.created_at, s.finish_reason,
               s.baseline_step_time_s, coalesce(p.trials, 0) AS trials, coalesce(p.running, 0) AS running,
               coalesce(p.failed, 0) AS failed, coalesce(p.accelerator_s, 0) AS accelerator_s, p.best_step_s,
               v.best_verified_speedup, v.best_verified_ci_low, coalesce(m.types, []) AS milestones
        FROM studies s
        LEFT JOIN per_study p USING (study_id)
        LEFT JOIN verified v USING (study_id)
        LEFT JOIN milestones m USING (study_id)
        ORDER BY s.created_at DESC NULLS LAST, s.study_id DESC
        """,
    )
    out = []
    for row in rows:
        base, best = row["baseline_step_time_s"], row["best_step_s"]
        out.append({
            **_columns(row, "study_id", "name", "goal", "accelerator"),
            "created_at": _iso(row["created_at"]),
            "stage": stage_of(list(row["milestones"]), row["running"]),
            **_columns(row, "finish_reason", "trials", "running", "failed"),
            "accelerator_hours": row["accelerator_s"] / 3600,
            "best_search_speedup": base / best if base and best else None,
            "best_verified_speedup": row["best_verified_speedup"],
        })
    return out


def _study_row(con: duckdb.DuckDBPyConnection, study_id: str) -> dict[str, Any]:
    rows = _rows(con, "SELECT * FROM studies WHERE study_id = $study", {"study": study_id})
    if not rows:
        raise UnknownStudy(study_id)
    return rows[0]


def trials(con: duckdb.DuckDBPyConnection, study_id: str, baseline_step_s: float | None) -> list[dict[str, Any]]:
    """The study's trials in the order they were proposed: candidate, origin, outcome, step time and peak
    memory beside what the models predicted, cost and invariant verdicts."""
    rows = _rows(
        con,
        """
        SELECT trial_id, kind, origin, candidate_key, knobs, patches, repeat, verify_id, status, finish_status,
               finish_reason, step_time_s, step_time_mad_s, predicted_step_time_s,
               CAST(prediction->>'peak_memory_bytes' AS DOUBLE) AS predicted_peak_bytes,
               CAST(prediction->>'p_oom' AS DOUBLE) AS predicted_p_oom,
               coalesce(peak_memory_bytes, launcher_peak_memory_bytes) AS peak_bytes, censored_peak_bytes,
               memory_capacity_bytes, accelerator_s, mfu, invariants_ok, invariants, failed_invariants,
               proposed_at, launched_at, finished_at, measured_at
        FROM trials WHERE study_id = $study
        ORDER BY proposed_at NULLS LAST, last_seq
        """,
        {"study": study_id},
    )
    out = []
    for n, row in enumerate(rows, start=1):
        step = row["step_time_s"]
        if row["finished_at"] is None and row["measured_at"] is None:
            outcome = "running" if row["launched_at"] is not None else "proposed"
        elif row["status"] == "ok" and row["invariants_ok"] is False:
            outcome = "invariant_violation"
        else:
            outcome = row["status"] or row["finish_status"]
        out.append({
            "n": n,
            **_columns(row, "trial_id", "kind", "origin", "candidate_key"),
            "knobs": _json(row["knobs"]) or {},
            "patches": _json(row["patches"]) or [],
            **_columns(row, "repeat", "verify_id"),
            "outcome": outcome,
            "reason": row["finish_reason"] or "",
            "step_time_s": step,
            **_columns(row, "step_time_mad_s", "predicted_step_time_s"),
            "speedup": baseline_step_s / step if baseline_step_s and step else None,
            **_columns(row, "peak_bytes", "predicted_peak_bytes", "predicted_p_oom", "censored_peak_bytes",
                       "accelerator_s", "mfu"),
            "invariants": _json(row["invariants"]) or [],
            "failed_invariants": _json(row["failed_invariants"]) or [],
            "proposed_at": _iso(row["proposed_at"]),
        })
    return out


def trial_progress(con: duckdb.DuckDBPyConnection, study_id: str) -> dict[str, int]:
    """Steps rank 0 has reported so far, per trial (the telemetry stream): how far a running trial has got."""
    rows = con.execute(
        "SELECT trial_id, max(step) FROM steps WHERE study_id = $study AND rank = 0 GROUP BY trial_id",
        {"study": study_id},
    ).fetchall()
    return {trial_id: int(step) for trial_id, step in rows if step is not None}


def _dimensions(searched: list[dict[str, Any]], shown: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every knob and patch the ``searched`` trials set, with each of the ``shown`` trials' values: a knob's value,
    or ``"golden"`` where the trial left it at the golden value; ``"on"``/``"off"`` for a patch. A dimension is
    numeric when every shown value is a number, else categorical (values as lower-case strings)."""
    knobs = sorted({k for t in searched for k in t["knobs"]})
    patches = sorted({p for t in searched for p in t["patches"]})
    dimensions = []
    for knob in knobs:
        values = [t["knobs"].get(knob, "golden") for t in shown]
        numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
        dimensions.append({"label": knob, "values": values if numeric else [str(v).lower() for v in values],
                           "categorical": not numeric})
    for patch in patches:
        dimensions.append({"label": f"patch {patch}", "values": ["on" if patch in t["patches"] else "off" for t in shown],
                           "categorical": True})
    return dimensions


def search_space_points(study_trials: list[dict[str, Any]]) -> dict[str, Any]:
    """optuna-dashboard's parallel-coordinate view: one line per measured search trial across every knob and patch
    the study's search trials set, coloured by speed-up (``_dimensions``)."""
    measured = [t for t in study_trials if t["kind"] == "search" and t["speedup"] is not None]
    searched = [t for t in study_trials if t["kind"] == "search"]
    return {
        "dimensions": _dimensions(searched, measured),
        "speedup": [t["speedup"] for t in measured],
        "trial_ids": [t["trial_id"] for t in measured],
        "counts": [t["outcome"] == "ok" for t in measured],
    }


UNDECIDED = ("proposed", "running", "cancelled")
"""Search trials that say nothing about their candidate yet (or ever: cancelled is the harness's doing)."""
RAN = ("ok", "invariant_violation", "oom", "crash", "timeout", "stopped_slow")
"""Outcomes of a trial that ran its candidate: what the OOM importance is fitted over."""


def search_analysis(study_trials: list[dict[str, Any]]) -> dict[str, Any]:
    """optuna-dashboard's slice, contour and importance views, for a training job: every search trial with a final
    outcome (OOMs, crashes and invariant violations included, each with its outcome; cancelled ones left out)
    with its value on every dimension (``_dimensions``) and its step time, and the importance of each dimension
    (``importance.main_effects``) for the log step time of the trials that measured one and for running out of
    memory over the trials that ran; the pairwise interactions' shares of the log step time (``importance.pairwise``)
    where there are trials enough, else why not."""
    searched = [t for t in study_trials if t["kind"] == "search"]
    done = [t for t in searched if t["outcome"] not in UNDECIDED]
    dimensions = _dimensions(searched, done)
    importances = []
    timed = [i for i, t in enumerate(done) if t["step_time_s"]]
    fitted = importance.main_effects({d["label"]: [d["values"][i] for i in timed] for d in dimensions},
                                     [math.log(done[i]["step_time_s"]) for i in timed], "log step time")
    ran = [i for i, t in enumerate(done) if t["outcome"] in RAN]
    ooms = [done[i]["outcome"] == "oom" for i in ran]
    oom = importance.main_effects({d["label"]: [d["values"][i] for i in ran] for d in dimensions},
                                  [float(x) for x in ooms], "OOM")
    for fit in (fitted, oom):
        if fit is not None:
            importances.append({"target": fit.target, "trials": fit.trials, "unexplained": fit.unexplained,
                                "ranked": [{"label": label, "share": share} for label, share in fit.ranked()]})
    pairs = importance.pairwise({d["label"]: [d["values"][i] for i in timed] for d in dimensions},
                                [math.log(done[i]["step_time_s"]) for i in timed], "log step time")
    interactions: dict[str, Any] = {"target": "log step time", "trials": len(timed)}
    if isinstance(pairs, importance.Importance):
        interactions["ranked"] = [{"label": label, "share": share} for label, share in pairs.ranked()
                                  if importance.PAIR in label]
        interactions["unexplained"] = pairs.unexplained
    else:
        interactions["reason"] = pairs
    return {
        "dimensions": dimensions,
        "trials": [{"trial_id": t["trial_id"], "n": t["n"], "outcome": t["outcome"], "step_time_s": t["step_time_s"],
                    "speedup": t["speedup"], "censored_peak_bytes": t["censored_peak_bytes"]} for t in done],
        "importance": importances,
        "interactions": interactions,
        "timed_trials": len(timed),
        "ran_trials": len(ran),
        "oom_trials": sum(ooms),
        "min_trials": importance.MIN_TRIALS,
    }


def best_over_trials(study_trials: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """optuna-dashboard's history plot for a speed-up: each measured search trial's speed-up in proposal order and
    the best so far among those that ran ``ok`` with every invariant held (a violation is data, never a win)."""
    best: float | None = None
    points = []
    for trial in study_trials:
        if trial["kind"] != "search" or trial["speedup"] is None:
            continue
        counts = trial["outcome"] == "ok"
        if counts and (best is None or trial["speedup"] > best):
            best = trial["speedup"]
        points.append({"n": trial["n"], "trial_id": trial["trial_id"], "speedup": trial["speedup"],
                       "counts": counts, "best": best})
    return points


def history(study_trials: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """optuna-dashboard's optimisation history for a step time: every trial with a final outcome in proposal order,
    its measured step time (``None`` for a trial that measured none: OOM, crash, timeout, refused), and the best
    (lowest) step time so far among the search trials that ran ``ok`` with every invariant held."""
    best: float | None = None
    points = []
    for trial in study_trials:
        if trial["outcome"] in UNDECIDED:
            continue
        step = trial["step_time_s"]
        counts = trial["kind"] == "search" and trial["outcome"] == "ok" and step is not None
        if counts and (best is None or step < best):
            best = step
        points.append({"n": trial["n"], "trial_id": trial["trial_id"], "kind": trial["kind"], "outcome": trial["outcome"],
                       "step_time_s": step, "counts": counts, "best_step_s": best})
    return points


def step_time_edf(study_trials: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """optuna-dashboard's empirical distribution function of the objective, per trial kind: the step times of the
    trials of that kind that ran ``ok`` with every invariant held, sorted, each with the fraction of those trials at or
    below it (a step of 1/n at every trial)."""
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for trial in study_trials:
        if trial["outcome"] == "ok" and trial["step_time_s"] is not None:
            by_kind.setdefault(trial["kind"] or "?", []).append(trial)
    out = []
    for kind, these in sorted(by_kind.items()):
        these = sorted(these, key=lambda t: t["step_time_s"])
        out.append({"kind": kind, "step_time_s": [t["step_time_s"] for t in these],
                    "fraction": [(i + 1) / len(these) for i in range(len(these))],
                    "trial_ids": [t["trial_id"] for t in these]})
    return out


def cost_by_outcome(study_trials: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Accelerator-hours by trial kind and outcome (failed trials' cost included; running trials count nothing
    until the launcher reports their cost)."""
    totals: dict[tuple[str, str], float] = {}
    for trial in study_trials:
        key = (trial["kind"] or "?", trial["outcome"] or "?")
        totals[key] = totals.get(key, 0.0) + (trial["accelerator_s"] or 0.0) / 3600
    return [{"kind": kind, "outcome": outcome, "accelerator_hours": hours}
            for (kind, outcome), hours in sorted(totals.items())]


def invariant_verdicts(study_trials: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per invariant: on how many measured trials it held and failed, and the failures with their detail."""
    by_name: dict[str, dict[str, Any]] = {}
    for trial in study_trials:
        for verdict in trial["invariants"]:
            entry = by_name.setdefault(verdict["name"], {"name": verdict["name"], "held": 0, "failed": 0, "failures": []})
            if verdict["ok"]:
                entry["held"] += 1
            else:
                entry["failed"] += 1
                entry["failures"].append({"trial_id": trial["trial_id"], "kind": trial["kind"],
                                          "detail": verdict.get("detail", "")})
    return sorted(by_name.values(), key=lambda e: e["name"])


def verifications(con: duckdb.DuckDBPyConnection, study_id: str) -> list[dict[str, Any]]:
    """Every verification round in log order: speed-up with its confidence interval, passes, the verdict."""
    rows = _rows(
        con,
        """
        SELECT verify_id, candidate_key, knobs, patches, passes, promotable, speedup, ci_low, ci_high,
               baseline_step_s, candidate_step_s, mfu_before, mfu_after, failed_invariants, trial_ids, ts
        FROM verifications WHERE study_id = $study ORDER BY seq
        """,
        {"study": study_id},
    )
    rounds: dict[str, int] = {}
    out = []
    for row in rows:
        rounds[row["candidate_key"]] = rounds.get(row["candidate_key"], 0) + 1
        out.append({
            **{k: row[k] for k in ("verify_id", "candidate_key", "passes", "promotable", "speedup", "ci_low",
                                   "ci_high", "baseline_step_s", "candidate_step_s", "mfu_before", "mfu_after")},
            "round": rounds[row["candidate_key"]],
            "knobs": _json(row["knobs"]) or {},
            "patches": _json(row["patches"]) or [],
            "failed_invariants": _json(row["failed_invariants"]) or [],
            "trials": len(_json(row["trial_ids"]) or []),
            "ts": _iso(row["ts"]),
        })
    return out


def agent_exchanges(con: duckdb.DuckDBPyConnection, study_id: str) -> list[dict[str, Any]]:
    """What the study's language model was asked and what it answered, question beside answer (``AgentAsked`` and
    ``AgentAnswered`` by ``ask_id``), with what passed the checks and what was refused."""
    rows = _rows(
        con,
        """
        SELECT type, payload, ts FROM lifecycle_events
        WHERE study_id = $study AND type IN ('AgentAsked', 'AgentAnswered') ORDER BY seq
        """,
        {"study": study_id},
    )
    exchanges: dict[str, dict[str, Any]] = {}
    for row in rows:
        payload = _json(row["payload"])
        entry = exchanges.setdefault(payload["ask_id"], {"ask_id": payload["ask_id"], "answered": False})
        if row["type"] == "AgentAsked":
            messages = payload.get("messages", [])
            entry.update(
                asked_at=_iso(row["ts"]), purpose=payload.get("purpose"), model=payload.get("model"),
                question=next((m["content"] for m in reversed(messages) if m["role"] == "user"), ""),
            )
        else:
            entry.update(
                answered=True, ok=payload.get("ok", True), error=payload.get("error"), detail=payload.get("detail", ""),
                answer=payload.get("text", ""),
                tokens=payload.get("prompt_tokens", 0) + payload.get("completion_tokens", 0),
                cost_usd=payload.get("cost_usd", 0.0), latency_s=payload.get("latency_s", 0.0),
                candidates=len(payload.get("candidates", [])), patches=[p["patch_id"] for p in payload.get("patches", [])],
                priors=len(payload.get("priors", [])),
                refused=[f"{r['kind']}: {r['item']}" for r in payload.get("refused", [])],
            )
    return list(exchanges.values())


def study(con: duckdb.DuckDBPyConnection, study_id: str) -> dict[str, Any]:
    """Everything the study page shows; ``UnknownStudy`` when the DB has no such study."""
    row = _study_row(con, study_id)
    cluster = _json(row["cluster"]) or {}
    baseline = row["baseline_step_time_s"]
    study_trials = trials(con, study_id, baseline)
    progress = trial_progress(con, study_id)
    for trial in study_trials:
        trial["steps_seen"] = progress.get(trial["trial_id"])
    summary = next((s for s in studies(con) if s["study_id"] == study_id), {})
    doctor_runs = [t["step_time_s"] for t in study_trials if t["kind"] == "doctor" and t["step_time_s"] is not None]
    return {
        "study_id": study_id,
        **_columns(row, "name", "goal", "accelerator"),
        "stage": summary.get("stage"),
        "finish_reason": row["finish_reason"],
        "memory_capacity_bytes": cluster.get("memory_capacity_bytes") or None,
        "baseline_step_time_s": baseline,
        "accelerator_hours": summary.get("accelerator_hours", 0.0),
        "best_search_speedup": summary.get("best_search_speedup"),
        "best_verified_speedup": summary.get("best_verified_speedup"),
        "doctor": None if row["doctor_completed_at"] is None else {
            "repeats": row["doctor_repeats"],
            "baseline_step_time_s": baseline,
            **_columns(row, "run_to_run_cv", "step_to_step_cv", "warmup_steps", "min_detectable_speedup",
                       "repeats_per_trial"),
            "phase_fractions": _json(row["phase_fractions"]) or {},
            "stragglers": _json(row["stragglers"]) or [],
            "baseline_mfu": row["baseline_mfu"],
            "run_step_times_s": doctor_runs,
        },
        "trials": study_trials,
        "best_over_trials": best_over_trials(study_trials),
        "history": history(study_trials),
        "edf": step_time_edf(study_trials),
        "search_space": search_space_points(study_trials),
        "analysis": search_analysis(study_trials),
        "cost_by_outcome": cost_by_outcome(study_trials),
        "invariants": invariant_verdicts(study_trials),
        "verifications": verifications(con, study_id),
        "agent": agent_exchanges(con, study_id),
    }


def _step_series(con: duckdb.DuckDBPyConnection, study_id: str, trial_id: str) -> list[dict[str, Any]]:
    """optuna-dashboard's intermediate values: the probe's per-step records of one trial (the telemetry stream), one
    series per rank: step number, step time, loss and peak memory as the probe reported them."""
    rows = _rows(
        con,
        """
        SELECT rank, step, step_time_s, loss, peak_memory_bytes FROM steps
        WHERE study_id = $study AND trial_id = $trial ORDER BY rank, step, seq
        """,
        {"study": study_id, "trial": trial_id},
    )
    series: dict[int, dict[str, Any]] = {}
    for row in rows:
        rank = series.setdefault(row["rank"], {"rank": row["rank"], "step": [], "step_time_s": [], "loss": [],
                                               "peak_bytes": []})
        rank["step"].append(row["step"])
        rank["step_time_s"].append(row["step_time_s"])
        rank["loss"].append(row["loss"])
        rank["peak_bytes"].append(row["peak_memory_bytes"])
    return list(series.values())


def trial_detail(con: duckdb.DuckDBPyConnection, study_id: str, trial_id: str) -> dict[str, Any]:
    """Everything a trial's own page shows: its row of the trials table, what the proposer said of it (origin,
    reason, the models' prediction) beside what was measured, where and how it ran, how it ended (the launcher's
    status, reason and exit code for a failed one), its per-step series (``_step_series``) and the loss curve the
    measurement kept, and every invariant's verdict. ``UnknownStudy``/``UnknownTrial`` when the DB has neither."""
    study_row = _study_row(con, study_id)
    study_trials = trials(con, study_id, study_row["baseline_step_time_s"])
    row = next((t for t in study_trials if t["trial_id"] == trial_id), None)
    if row is None:
        raise UnknownTrial(trial_id)
    [full] = _rows(con, "SELECT * FROM trials WHERE study_id = $study AND trial_id = $trial",
                   {"study": study_id, "trial": trial_id})
    measured = _rows(
        con,
        """
        SELECT payload->'loss_curve' AS loss_curve, payload->'eval_curve' AS eval_curve FROM lifecycle_events
        WHERE study_id = $study AND trial_id = $trial AND type = 'TrialMeasured' ORDER BY seq DESC LIMIT 1
        """,
        {"study": study_id, "trial": trial_id},
    )
    curves = measured[0] if measured else {}
    row["steps_seen"] = trial_progress(con, study_id).get(trial_id)
    prediction = _json(full["prediction"]) or {}
    return {
        "study_id": study_id,
        "study_name": study_row["name"],
        "baseline_step_time_s": study_row["baseline_step_time_s"],
        "memory_capacity_bytes": full["memory_capacity_bytes"] or (_json(study_row["cluster"]) or {}).get("memory_capacity_bytes"),
        "trial": row,
        "proposal": {"reason": full["reason"], "horizon_steps": full["horizon_steps"], "prediction": prediction},
        "launch": {k: full[k] for k in ("backend", "host", "job_id", "nodes", "ranks")} | {
            "launched_at": _iso(full["launched_at"])},
        "finish": {k: full[k] for k in ("status", "finish_status", "finish_reason", "exit_code", "wall_s", "accelerator_s",
                                        "steps_completed", "censored_peak_bytes")} | {"finished_at": _iso(full["finished_at"])},
        "measured": {k: full[k] for k in ("step_time_s", "step_time_mad_s", "step_time_with_warmup_s", "tokens_per_s", "mfu",
                                          "measured_steps", "warmup_steps", "final_loss", "measured_accelerator_s")} | {
            "peak_memory_per_rank": _json(full["peak_memory_per_rank"]) or [],
            "per_rank_step_s": _json(full["per_rank_step_s"]) or [],
            "phases": _json(full["phases"]) or {}, "measured_at": _iso(full["measured_at"])},
        "steps": _step_series(con, study_id, trial_id),
        "loss_curve": _json(curves.get("loss_curve")) or [],
        "eval_curve": _json(curves.get("eval_curve")) or [],
    }
