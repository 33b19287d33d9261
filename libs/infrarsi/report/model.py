"""The report model: everything a study report says, built by SQL over the analyst DuckDB.

``build_report(db, study_id)`` reads only the view ``report_events`` (see ``report.source``) and the
workload's patch files (for the audit trail's diff text). Renderers (``report.render``) turn the ``Report``
into HTML, Markdown and PDF; they compute nothing new, so every number in every format is one of the
figures below, each traceable to a query in this module.

Accounting rules (also in docs/stages.md):

- accelerator-hours are ``TrialFinished.accelerator_s`` / 3600 of *every* trial (doctor, search, verify,
  failed ones too), split by outcome: ``ok``; ``oom``; ``crash`` (crash, cancelled, patch_conflict);
  ``timeout``; ``violation`` (scope_violation, invariant_violation, and an ``ok`` run whose
  ``TrialMeasured.invariants_ok`` is false);
- the baseline step time is ``DoctorCompleted.step_time_s`` (the last one), else the median of the
  baseline/doctor trials' ``TrialMeasured.step_time_s``;
- "best speed-up after n search trials" = baseline / the fastest ok, invariant-passing search run among the
  first n measured (in stream order);
- winners are the final ``VerifyCompleted`` of each verification that is ``promotable``.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import duckdb
import msgspec

from infrarsi import events as ev
from infrarsi.agent.answers import NotJSON, parse_json_object
from infrarsi.agent.draft_log import request_of
from infrarsi.report.source import VIEW, ReportSourceError, ensure_view
from infrarsi.study.contract import Contract, ContractError, load_patch_library, locked_contract

P = TypeVar("P", bound=msgspec.Struct)

OUTCOMES = ("ok", "oom", "crash", "timeout", "slow", "violation")
"""How a trial is counted in the report; ``slow``: stopped early as far slower than the incumbent (``stopped_slow``)."""

OUTCOME_SQL = """
CASE
  WHEN f.status = 'ok' AND coalesce(m.invariants_ok, TRUE) THEN 'ok'
  WHEN f.status = 'ok' THEN 'violation'
  WHEN f.status = 'oom' THEN 'oom'
  WHEN f.status = 'timeout' THEN 'timeout'
  WHEN f.status = 'stopped_slow' THEN 'slow'
  WHEN f.status IN ('scope_violation', 'invariant_violation') THEN 'violation'
  ELSE 'crash'
END
"""


def trials_sql(view: str = VIEW) -> str:
    """One row per trial: proposal, launcher's finish, telemetry's measurement (last of each)."""
    return f"""
    WITH p AS (
      SELECT trial_id, arg_max(payload, seq) AS payload, min(seq) AS seq
      FROM {view} WHERE study_id = $study AND type = 'TrialProposed' AND trial_id IS NOT NULL GROUP BY trial_id
    ), f AS (
      SELECT trial_id, arg_max(payload, seq) AS payload
      FROM {view} WHERE study_id = $study AND type = 'TrialFinished' GROUP BY trial_id
    ), m AS (
      SELECT trial_id, arg_max(payload, seq) AS payload, max(seq) AS seq
      FROM {view} WHERE study_id = $study AND type = 'TrialMeasured' GROUP BY trial_id
    )
    SELECT p.trial_id,
           p.seq AS proposed_seq,
           m.seq AS measured_seq,
           p.payload->>'kind' AS kind,
           p.payload->>'origin' AS origin,
           p.payload->>'candidate_key' AS candidate_key,
           CAST(p.payload->'candidate' AS VARCHAR) AS candidate_json,
           p.payload->>'verify_id' AS verify_id,
           f.payload->>'status' AS status,
           f.payload->>'reason' AS reason,
           coalesce(CAST(f.payload->>'accelerator_s' AS DOUBLE), 0.0) AS accelerator_s,
           CAST(f.payload->>'censored_peak_bytes' AS BIGINT) AS censored_peak_bytes,
           CAST(f.payload->>'peak_memory_bytes' AS BIGINT) AS launcher_peak_bytes,
           CAST(f.payload->>'memory_capacity_bytes' AS BIGINT) AS memory_capacity_bytes,
           CAST(m.payload->>'step_time_s' AS DOUBLE) AS step_time_s,
           CAST(m.payload->>'mfu' AS DOUBLE) AS mfu,
           list_max(CAST(m.payload->'peak_memory_bytes' AS BIGINT[])) AS peak_memory_bytes,
           CAST(m.payload->>'invariants_ok' AS BOOLEAN) AS invariants_ok,
           CAST(m.payload->'invariants' AS VARCHAR) AS invariants_json,
           coalesce(CAST(m.payload->>'coarse' AS BOOLEAN), FALSE) AS coarse,
           coalesce(CAST(m.payload->>'loss_from_log' AS BOOLEAN), FALSE) AS loss_from_log,
           CAST(m.payload->'unchecked_invariants' AS VARCHAR) AS unchecked_json
    FROM p LEFT JOIN f USING (trial_id) LEFT JOIN m USING (trial_id)
    """


def cost_sql(view: str = VIEW) -> str:
    """Accelerator-hours by outcome, over every finished trial of the study."""
    return f"""
    WITH f AS (
      SELECT trial_id, arg_max(payload, seq) AS payload
      FROM {view} WHERE study_id = $study AND type = 'TrialFinished' GROUP BY trial_id
    ), fin AS (SELECT trial_id, payload->>'status' AS status, CAST(payload->>'accelerator_s' AS DOUBLE) AS acc_s FROM f),
    m AS (
      SELECT trial_id, CAST(arg_max(payload, seq)->>'invariants_ok' AS BOOLEAN) AS invariants_ok
      FROM {view} WHERE study_id = $study AND type = 'TrialMeasured' GROUP BY trial_id
    )
    SELECT {OUTCOME_SQL} AS outcome, count(*) AS trials, sum(coalesce(f.acc_s, 0)) / 3600.0 AS accelerator_hours
    FROM fin f LEFT JOIN m USING (trial_id)
    GROUP BY outcome
    """


# --------------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrialRow:
    trial_id: str
    order: int
    kind: str
    origin: str
    candidate_key: str
    knobs: dict[str, Any]
    patches: list[str]
    status: str | None
    outcome: str | None
    accelerator_s: float
    step_time_s: float | None
    peak_memory_bytes: int | None
    censored_peak_bytes: int | None
    mfu: float | None
    invariants_ok: bool | None
    failed_invariants: list[str]
    reason: str = ""
    coarse: bool = False
    """Measured from outside (the job has no probe)."""
    unchecked_invariants: list[str] = field(default_factory=list)
    """Invariants the trial could not check (coarse): never counted as held."""
    loss_from_log: bool = False
    """Coarse: the loss was read from the job's printed output."""


@dataclass(frozen=True)
class PatchAudit:
    patch_id: str
    files: list[str]
    diff: str
    found: bool
    proposed_by: str = "library"
    """``library`` (the workload's patch library), ``bank`` (a library patch first tried in a bank seed) or
    ``agent`` (a diff of the study's language model, ``AgentAnswered``)."""
    reason: str = ""
    """The proposer's words: the agent's stated reason and description, or the library entry's description."""
    expected_time_log_ratio: float | None = None
    """What its proposer expected of log(step time with / without); the agent's stated number, or the library's
    prior mean."""
    measured_time_log_ratio: float | None = None
    """The step-time model's posterior mean of the patch's effect (last ``ModelUpdated``)."""


@dataclass(frozen=True)
class AgentPatchRow:
    """One diff the agent proposed and the gates accepted, with what happened to it."""

    patch_id: str
    description: str
    reason: str
    files: list[str]
    expected_time_log_ratio: float
    expected_memory_log_ratio: float
    trials: int
    outcomes: list[str]
    """The outcome of each search trial whose candidate held the patch."""
    failed_invariants: list[str]
    best_step_ratio: float | None
    """Fastest invariant-keeping trial holding the patch / baseline step time."""
    verdict: str
    """``promoted`` (a promotable verified winner holds it), ``verified-rejected``, ``rejected by invariant``,
    ``not verified``, or ``not tried``."""


@dataclass(frozen=True)
class AgentSummary:
    """What the study's language model was asked, what it cost, and what became of its answers."""

    model: str
    exchanges: int
    failed: dict[str, int]
    """Exchanges without a usable answer, by error name (``timeout``, ``not_json``, ``budget_exceeded``…)."""
    tokens: int
    cost_usd: float
    budget_tokens: int
    refusals: list[tuple[str, str, str]]
    """(kind, item, detail) of every part of an answer the gates refused."""
    patches: list[AgentPatchRow]
    candidates: list[tuple[str, str]]
    """(candidate key, the model's reason) of each checked candidate it proposed."""


@dataclass(frozen=True)
class ContractDraft:
    """How the study's contract began: the model's draft that ``init --ask`` had the user accept."""

    model: str
    request: str
    reason: str
    tokens: int
    cost_usd: float
    note: str
    """``AgentAnswered.detail``: e.g. that the contract was edited after the draft was accepted."""


class Verdict(ev.VerifyCompleted, frozen=True, kw_only=True):
    """The final ``VerifyCompleted`` of one verification, with its audit trail."""

    patches: list[PatchAudit]
    rounds: int

    @property
    def knobs(self) -> dict[str, Any]:
        return dict(self.candidate.knobs)

    @property
    def files_changed(self) -> list[str]:
        return sorted({f for p in self.patches for f in p.files})


@dataclass(frozen=True)
class PromotionRow:
    """A promoted branch as the log last saw it: written by ``apply``, followed by ``infrarsi follow``, smoked by
    ``infrarsi smoke``."""

    candidate_key: str
    branch: str
    commit: str
    state: str
    """``PromotionFollowed.state`` (open, merged, reverted, gone), or ``not followed``."""
    mainline: str = ""
    merge_commit: str | None = None
    revert_commit: str | None = None
    smoke: ev.SmokeCompleted | None = None
    """The last smoke run of its merge commit."""


@dataclass(frozen=True)
class Report:
    study_id: str
    name: str
    goal: str
    contract: Contract
    cluster: ev.ClusterInfo
    workload_dir: str
    baseline_ref: str
    baseline_step_s: float | None
    doctor: ev.DoctorCompleted | None
    doctor_run_step_s: list[float]
    trials: list[TrialRow]
    cost_by_outcome: dict[str, float]
    """Accelerator-hours per outcome (every outcome key present)."""
    trials_by_outcome: dict[str, int]
    best_speedup_curve: list[tuple[int, float]]
    """(search trials measured so far, best speed-up so far)."""
    verdicts: list[Verdict]
    model: ev.ModelUpdated | None
    """The last ModelUpdated."""
    invariant_failures: dict[str, int]
    """Search/verify runs failing each invariant (from TrialMeasured)."""
    memory_capacity_bytes: int | None
    generated_from: dict[str, int] = field(default_factory=dict)
    """Event counts by type: what the report was built from."""
    agent: AgentSummary | None = None
    """``None`` when the study never asked a model for proposals."""
    contract_draft: ContractDraft | None = None
    """``None`` unless the contract was drafted by ``init --ask``."""
    promotions: list[PromotionRow] = field(default_factory=list)
    """Branches ``apply`` wrote, with where they stand on the main line (``infrarsi follow``)."""

    @property
    def winners(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.promotable]

    @property
    def accelerator_hours(self) -> float:
        return sum(self.cost_by_outcome.values())


# --------------------------------------------------------------------------------------------------
# Building it
# --------------------------------------------------------------------------------------------------


def _connect(db: str | Path | duckdb.DuckDBPyConnection) -> tuple[duckdb.DuckDBPyConnection, bool]:
    if isinstance(db, duckdb.DuckDBPyConnection):
        return db, False
    return duckdb.connect(str(db), read_only=False), True


def _last_payload(con: duckdb.DuckDBPyConnection, study_id: str, payload_type: type[P]) -> P | None:
    """The study's last payload of ``payload_type``, decoded into its struct."""
    row = con.execute(
        f"SELECT CAST(payload AS VARCHAR) FROM {VIEW} WHERE study_id = $study AND type = $type ORDER BY seq DESC LIMIT 1",
        {"study": study_id, "type": payload_type.__name__},
    ).fetchone()
    if row is None:
        return None
    try:
        return msgspec.json.decode(row[0], type=payload_type)
    except msgspec.ValidationError as exc:
        raise ReportSourceError(f"the study's {payload_type.__name__} does not decode: {exc}") from None


def _patch_audit(workload_dir: Path | None, patch_dir: str, patch_id: str, origins: _PatchOrigins) -> PatchAudit:
    measured = origins.posterior.get(f"patch:{patch_id}")
    agent = origins.agent.get(patch_id)
    if agent is not None:
        reason = " — ".join(x for x in (agent.description, agent.reason) if x)
        return PatchAudit(patch_id, list(agent.files), agent.diff, True, "agent", reason,
                          agent.expected_time_log_ratio, measured)
    proposed_by = "bank" if patch_id in origins.bank else "library"
    if workload_dir is not None:
        try:  # the library's index names each diff (<id>.patch, <id>.diff, or an explicit file)
            path: Path | None = load_patch_library(workload_dir / patch_dir)[patch_id].path
        except (ContractError, KeyError):
            path = None
        if path is not None and path.is_file():
            info = load_patch_library(workload_dir / patch_dir)[patch_id]
            diff = path.read_text(errors="replace")
            files = sorted(set(re.findall(r"^\+\+\+ b/(\S+)", diff, flags=re.M)) | set(re.findall(r"^--- a/(\S+)", diff, flags=re.M)))
            return PatchAudit(patch_id, files, diff, True, proposed_by, info.description,
                              info.time_log_ratio.mean, measured)
    return PatchAudit(patch_id, [], "", False, proposed_by, measured_time_log_ratio=measured)


@dataclass(frozen=True)
class _PatchOrigins:
    agent: dict[str, ev.AgentPatch]
    """The agent's accepted diffs (``AgentAnswered.patches``), by patch id."""
    bank: set[str]
    """Library patches whose first search trial was a bank seed."""
    posterior: dict[str, float]
    """Posterior mean of each feature's time effect, from the last ``ModelUpdated``."""


def _patch_origins(answers: list[ev.AgentAnswered], trials: list[TrialRow], model: ev.ModelUpdated | None
                   ) -> _PatchOrigins:
    agent = {p.patch_id: p for a in answers for p in a.patches}
    first: dict[str, str] = {}
    for t in trials:
        if t.kind == "search":
            for p in t.patches:
                first.setdefault(p, t.origin)
    posterior = {e.feature: e.post_mean for e in model.time_effects} if model is not None else {}
    return _PatchOrigins(agent, {p for p, origin in first.items() if origin == "bank"}, posterior)


def build_report(db: str | Path | duckdb.DuckDBPyConnection, study_id: str) -> Report:
    """The report of ``study_id`` from the analyst DB (a path or an open connection)."""
    con, owned = _connect(db)
    try:
        ensure_view(con)
        return _build(con, study_id)
    finally:
        if owned:
            con.close()


def _build(con: duckdb.DuckDBPyConnection, study_id: str) -> Report:
    params = {"study": study_id}
    created = _last_payload(con, study_id, ev.StudyCreated)
    if created is None:
        raise LookupError(f"no StudyCreated for study {study_id!r} in the analyst DB")
    try:
        contract = locked_contract(created)
    except ContractError as exc:
        raise ReportSourceError(f"the study's contract does not load: {exc}") from None
    doctor = _last_payload(con, study_id, ev.DoctorCompleted)
    model = _last_payload(con, study_id, ev.ModelUpdated)

    counts = dict(con.execute(f"SELECT type, count(*) FROM {VIEW} WHERE study_id = $study GROUP BY type ORDER BY type", params).fetchall())

    rows = con.execute(trials_sql() + " ORDER BY coalesce(m.seq, p.seq), p.trial_id", params).fetchall()
    cols = [d[0] for d in con.description]
    trials = []
    for i, raw in enumerate(rows):
        r = dict(zip(cols, raw, strict=True))
        candidate = json.loads(r["candidate_json"] or "{}")
        invariants = json.loads(r["invariants_json"] or "[]")
        outcome = None
        if r["status"] is not None:
            outcome = _outcome(r["status"], r["invariants_ok"])
        trials.append(
            TrialRow(
                trial_id=r["trial_id"], order=i, kind=r["kind"], origin=r["origin"], candidate_key=r["candidate_key"],
                knobs=candidate.get("knobs", {}), patches=candidate.get("patches", []), status=r["status"], outcome=outcome,
                accelerator_s=r["accelerator_s"], step_time_s=r["step_time_s"],
                peak_memory_bytes=r["peak_memory_bytes"] or r["launcher_peak_bytes"],
                censored_peak_bytes=r["censored_peak_bytes"], mfu=r["mfu"], invariants_ok=r["invariants_ok"],
                failed_invariants=[inv["name"] for inv in invariants if not inv.get("ok", True)], reason=r["reason"] or "",
                coarse=bool(r["coarse"]), unchecked_invariants=[u["name"] for u in json.loads(r["unchecked_json"] or "[]")],
                loss_from_log=bool(r["loss_from_log"]),
            )
        )

    cost = {o: 0.0 for o in OUTCOMES}
    n_by_outcome = {o: 0 for o in OUTCOMES}
    for outcome, n, hours in con.execute(cost_sql(), params).fetchall():
        cost[outcome] = float(hours)
        n_by_outcome[outcome] = int(n)

    if doctor is not None:
        baseline_s = doctor.step_time_s
        doctor_ids = list(doctor.baseline_trial_ids)
    else:
        (median_row,) = con.execute(  # an aggregate: exactly one row
            f"""SELECT median(CAST(m.payload->>'step_time_s' AS DOUBLE)) FROM {VIEW} m
                WHERE m.study_id = $study AND m.type = 'TrialMeasured' AND m.payload->>'status' = 'ok'
                  AND m.payload->>'kind' IN ('baseline', 'doctor')""",
            params,
        ).fetchall()
        baseline_s = median_row[0]
        doctor_ids = [t.trial_id for t in trials if t.kind == "doctor"]
    doctor_runs = [t.step_time_s for t in trials if t.trial_id in set(doctor_ids) and t.step_time_s]

    curve: list[tuple[int, float]] = []
    if baseline_s:
        best = None
        n = 0
        for t in trials:
            if t.kind != "search" or t.step_time_s is None:
                continue
            n += 1
            if t.outcome == "ok" and (best is None or t.step_time_s < best):
                best = t.step_time_s
            curve.append((n, baseline_s / best if best else 1.0))

    invariant_failures: dict[str, int] = {}
    for t in trials:
        for name in t.failed_invariants:
            invariant_failures[name] = invariant_failures.get(name, 0) + 1

    workload_dir = _workload_dir(created, contract)
    asked = _payloads(con, study_id, ev.AgentAsked)
    answers = _payloads(con, study_id, ev.AgentAnswered)
    drafted = {a.ask_id: a for a in asked if a.purpose == "contract"}
    contract_draft = _contract_draft(drafted, answers)
    asked = [a for a in asked if a.ask_id not in drafted]
    answers = [a for a in answers if a.ask_id not in drafted]
    origins = _patch_origins(answers, trials, model)
    verdicts = _verdicts(con, study_id, workload_dir, str(contract.workload.patch_dir), origins)
    agent = _agent_summary(asked, answers, trials, verdicts, baseline_s, contract) if asked else None
    capacity = created.cluster.memory_capacity_bytes or None
    promotions = _promotions(con, study_id)
    return Report(
        study_id=study_id, name=created.name, goal=created.goal, contract=contract,
        cluster=created.cluster, workload_dir=created.workload_dir,
        baseline_ref=created.baseline_ref, baseline_step_s=baseline_s, doctor=doctor,
        doctor_run_step_s=doctor_runs, trials=trials, cost_by_outcome=cost, trials_by_outcome=n_by_outcome,
        best_speedup_curve=curve, verdicts=verdicts, model=model, invariant_failures=invariant_failures,
        memory_capacity_bytes=capacity, generated_from=counts, agent=agent, contract_draft=contract_draft,
        promotions=promotions,
    )


def _promotions(con: duckdb.DuckDBPyConnection, study_id: str) -> list[PromotionRow]:
    followed = {f.branch: f for f in _payloads(con, study_id, ev.PromotionFollowed)}
    smokes = {s.commit: s for s in _payloads(con, study_id, ev.SmokeCompleted)}
    rows = []
    for p in _payloads(con, study_id, ev.PatchPromoted):
        f = followed.get(p.branch)
        if f is None:
            rows.append(PromotionRow(p.candidate_key, p.branch, p.commit, "not followed"))
            continue
        rows.append(PromotionRow(p.candidate_key, p.branch, p.commit, f.state, f.mainline, f.merge_commit,
                                 f.revert_commit, smokes.get(f.merge_commit or "")))
    return rows


def _contract_draft(drafted: dict[str, ev.AgentAsked], answers: list[ev.AgentAnswered]) -> ContractDraft | None:
    """The ``init --ask`` exchange (``agent.draft_log``), if the contract came from one."""
    answer = next((a for a in answers if a.ask_id in drafted), None)
    if answer is None:
        return None
    try:
        reason = str(parse_json_object(answer.text).get("reason", ""))
    except NotJSON:
        reason = ""
    asked = drafted[answer.ask_id]
    return ContractDraft(model=asked.model, request=request_of(asked), reason=reason, tokens=answer.tokens,
                         cost_usd=answer.cost_usd, note=answer.detail)


def _payloads(con: duckdb.DuckDBPyConnection, study_id: str, payload_type: type[P]) -> list[P]:
    """Every payload of ``payload_type`` of the study, in log order, decoded into its struct."""
    rows = con.execute(
        f"SELECT CAST(payload AS VARCHAR) FROM {VIEW} WHERE study_id = $study AND type = $type ORDER BY seq",
        {"study": study_id, "type": payload_type.__name__},
    ).fetchall()
    try:
        return [msgspec.json.decode(r[0], type=payload_type) for r in rows]
    except msgspec.ValidationError as exc:
        raise ReportSourceError(f"the study's {payload_type.__name__} does not decode: {exc}") from None


def _agent_summary(asked: list[ev.AgentAsked], answers: list[ev.AgentAnswered], trials: list[TrialRow],
                   verdicts: list[Verdict], baseline_s: float | None, contract: Contract) -> AgentSummary:
    failed: dict[str, int] = {}
    for a in answers:
        if not a.ok:
            failed[a.error or "unknown"] = failed.get(a.error or "unknown", 0) + 1
    return AgentSummary(
        model=asked[0].model, exchanges=len(asked), failed=failed, tokens=sum(a.tokens for a in answers),
        cost_usd=sum(a.cost_usd for a in answers), budget_tokens=contract.budget.llm_tokens,
        refusals=[(r.kind, r.item, r.detail) for a in answers for r in a.refused],
        patches=[_agent_patch_row(p, trials, verdicts, baseline_s) for a in answers for p in a.patches],
        candidates=[(c.candidate.key(), c.reason) for a in answers for c in a.candidates],
    )


def _agent_patch_row(p: ev.AgentPatch, trials: list[TrialRow], verdicts: list[Verdict],
                     baseline_s: float | None) -> AgentPatchRow:
    held = [t for t in trials if t.kind == "search" and p.patch_id in t.patches and t.outcome is not None]
    failed = sorted({name for t in held for name in t.failed_invariants})
    ok_times = [t.step_time_s for t in held if t.outcome == "ok" and t.step_time_s]
    best = min(ok_times) / baseline_s if ok_times and baseline_s else None
    mine = [v for v in verdicts if any(a.patch_id == p.patch_id for a in v.patches)]
    if any(v.promotable for v in mine):
        verdict = "promoted"
    elif mine:
        verdict = "verified-rejected"
    elif failed:
        verdict = "rejected by invariant"
    else:
        verdict = "not verified" if held else "not tried"
    return AgentPatchRow(
        patch_id=p.patch_id, description=p.description, reason=p.reason, files=list(p.files),
        expected_time_log_ratio=p.expected_time_log_ratio, expected_memory_log_ratio=p.expected_memory_log_ratio,
        trials=len(held), outcomes=[t.outcome or "" for t in held], failed_invariants=failed, best_step_ratio=best,
        verdict=verdict,
    )


def _outcome(status: str, invariants_ok: bool | None) -> str:
    if status == "ok":
        return "ok" if invariants_ok is not False else "violation"
    if status in ("oom", "timeout"):
        return status
    if status == "stopped_slow":
        return "slow"
    if status in ("scope_violation", "invariant_violation"):
        return "violation"
    return "crash"


def _workload_dir(created: ev.StudyCreated, contract: Contract) -> Path | None:
    for candidate in (created.workload_dir, contract.workload.repo):
        if candidate and Path(candidate).is_dir():
            return Path(candidate)
    return None


def _verdicts(con: duckdb.DuckDBPyConnection, study_id: str, workload_dir: Path | None, patch_dir: str, origins: _PatchOrigins) -> list[Verdict]:
    rows = con.execute(
        f"""SELECT payload->>'verify_id' AS verify_id, count(*) AS rounds, CAST(arg_max(payload, seq) AS VARCHAR) AS last
            FROM {VIEW} WHERE study_id = $study AND type = 'VerifyCompleted'
            GROUP BY verify_id ORDER BY min(seq)""",
        {"study": study_id},
    ).fetchall()
    out = []
    for _verify_id, rounds, last_json in rows:
        last = msgspec.json.decode(last_json, type=ev.VerifyCompleted)
        patches = [_patch_audit(workload_dir, patch_dir, p, origins) for p in last.candidate.patches]
        out.append(Verdict(**msgspec.structs.asdict(last), patches=patches, rounds=int(rounds)))
    out.sort(key=lambda v: (not v.promotable, -v.speedup))
    return out
