"""The event catalog: every message InfraRSI puts on the bus, and the one envelope around it.

This module is the single source of the wire format. Each payload is a ``msgspec.Struct`` tagged with
its class name; all payloads form one union, ``Payload``; every message is one ``Event`` envelope.
JSON Schema in ``schemas/`` is generated from here (``make schemas``), never written by hand.

Which subject and stream each event travels on, and who publishes and consumes it: ``infrarsi.bus.subjects``.

This module owns the types and their encoding only; it must not do I/O.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import Any, Generic, Literal, TypeVar

import msgspec

SCHEMA_VERSION = 1

# --------------------------------------------------------------------------------------------------
# Identifiers
# --------------------------------------------------------------------------------------------------

_CROCKFORD = "0123456789abcdefghjkmnpqrstvwxyz"


def new_id() -> str:
    """A ULID in lower-case Crockford base32: 26 characters, sortable by creation time.

    Used for study, trial and event ids; safe as a NATS subject token (no dots, no wildcards).
    """
    value = (time.time_ns() // 1_000_000) << 80 | int.from_bytes(secrets.token_bytes(10), "big")
    chars = []
    for _ in range(26):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    return "".join(reversed(chars))


def derived_id(*parts: str) -> str:
    """A deterministic id for an event that is a reaction to another.

    A service that crashes after publishing but before acking its input re-runs the handler on
    redelivery; deriving the output's id (and so its ``Nats-Msg-Id``) from the input event id and
    the output's kind makes JetStream drop the second copy.
    """
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:26]


# --------------------------------------------------------------------------------------------------
# Shared value types
# --------------------------------------------------------------------------------------------------

KnobValue = bool | int | float | str

TrialKind = Literal["baseline", "doctor", "search", "verify"]
"""Why a trial runs: the untouched baseline, a doctor repeat, a search candidate, or a verification run."""

Origin = Literal["baseline", "manual", "seed", "prior", "ei", "pairing", "bank", "llm", "verify", "confirm"]
"""Why the proposer (or a user) chose a candidate."""

TrialStatus = Literal[
    "ok",
    "oom",
    "crash",
    "timeout",
    "stopped_slow",
    "cancelled",
    "scope_violation",
    "patch_conflict",
    "invariant_violation",
]
"""How a trial ended. ``stopped_slow``: a search trial whose steady steps were already far slower than the
study's incumbent, stopped early at telemetry's request (``TrialStopRequested``); its steps are a measurement."""


class Candidate(msgspec.Struct, frozen=True, kw_only=True):
    """A point of the search space: launch-key overrides plus a set of patches."""

    knobs: dict[str, KnobValue] = {}
    """Launch keys that differ from, or restate, the golden baseline's launch file."""
    patches: list[str] = []
    """Patch ids from the workload's patch library, applied in this order."""

    def key(self) -> str:
        """Canonical identity: same knobs and patch set → same key, whatever the order."""
        body = msgspec.json.encode({"knobs": dict(sorted(self.knobs.items())), "patches": sorted(self.patches)})
        return hashlib.sha256(body).hexdigest()[:16]


class Prediction(msgspec.Struct, frozen=True, kw_only=True):
    """What the models expected of a candidate when it was proposed."""

    step_time_s: float
    step_time_std_log: float
    peak_memory_bytes: float | None = None
    p_oom: float = 0.0
    p_invariants: float = 1.0
    expected_improvement: float = 0.0


class LossPoint(msgspec.Struct, frozen=True, array_like=True):
    """(step, loss) — array-like on the wire to keep curves compact."""

    step: int
    loss: float


InvariantName = Literal[
    "scope", "work.optimizer_steps", "work.tokens", "work.eval", "loss", "loss.trend", "loss.parity",
    "parity.deterministic", "timing", "checkpoint.restart", "checkpoint.across_change", "downstream",
]
"""``loss.trend``, ``loss.parity`` and ``parity.deterministic`` are judged at verify only: the trend of the loss
gap over the verify horizon, the contract's numeric parity mode, and whether a run under ``bitwise`` parity kept
torch's deterministic algorithms on. So are ``checkpoint.restart`` / ``checkpoint.across_change`` (a fresh process
resumed from a mid-run checkpoint continues the uninterrupted run) and ``downstream`` (the contract's evaluation
of the final weights, against the paired baseline's)."""


class InvariantResult(msgspec.Struct, frozen=True, kw_only=True):
    """The verdict of one invariant on one trial (ARCHITECTURE.md §7)."""

    name: InvariantName
    ok: bool
    detail: str
    observed: float | None = None
    expected: float | None = None
    tolerance: float | None = None


class WorkloadShape(msgspec.Struct, frozen=True, kw_only=True):
    """The trained model's shape as the probe read it when it attached (``infrarsi.probe.shape``): what
    the structural memory formula needs. ``None``: the probe could not tell (the contract may say)."""

    parameters: int
    """All parameters of this rank's model as attached (before any sharding wrapper)."""
    expert_parameters: int = 0
    """Of which in MoE experts (0 for a dense model)."""
    layers: int | None = None
    hidden: int | None = None
    heads: int | None = None
    seq_len: int | None = None
    """Tokens per training sequence, as fed to the model (a config's context length only as a fallback)."""
    vocab: int | None = None
    experts: int | None = None
    experts_per_token: int | None = None
    sources: dict[str, str] = {}
    """Field → where it came from: ``config``, ``module`` (inspection), ``inputs`` (the first forward)."""


class UncheckedInvariant(msgspec.Struct, frozen=True, kw_only=True):
    """An invariant a coarse trial could not check (no probe): named with the reason, never passed."""

    name: InvariantName
    reason: str


class OutputStep(msgspec.Struct, frozen=True, kw_only=True):
    """A step count read from a job's output by the contract's ``step_regex`` (coarse measurement)."""

    steps_done: int
    """Steps completed by then, as the job's output says."""
    seen_s: float
    """Launcher's clock (s since launch) when the line became visible; ``-1`` when only the output's tail
    was read after the job ended (no time known)."""


class PrintedStepTime(msgspec.Struct, frozen=True, array_like=True):
    """A step time a job printed on one of its step lines (coarse measurement): ``[seen_s, step_time_s]``."""

    seen_s: float
    """Launcher's clock (s since launch) when the line became visible; ``-1`` when only the output's tail
    was read after the job ended."""
    step_time_s: float
    """The time the job says the step took."""


class Effect(msgspec.Struct, frozen=True, kw_only=True):
    """One feature's effect in a model: log-ratio on step time or on peak memory, prior vs posterior."""

    feature: str
    """Encoded feature, e.g. ``autocast_dtype=bfloat16`` or ``patch:fused-qkv``."""
    prior_mean: float
    prior_std: float
    post_mean: float
    post_std: float
    source: str = "knowledge_base"
    """Where the prior came from: knowledge_base, patch_metadata, bank, llm, flat."""


class ClusterInfo(msgspec.Struct, frozen=True, kw_only=True):
    """Where trials run; also the metadata a bank entry is matched on."""

    cluster_id: str
    accelerator: str
    """SKU, e.g. ``cpu``, ``A100-80G``, ``H100-80G``, ``H200-141G``."""
    nodes: int = 1
    devices_per_node: int = 1
    memory_capacity_bytes: int = 0
    """Per device; emulated on a CPU host."""
    peak_flops: float | None = None
    """Per device; ``None`` until doctor measures it (CPU hosts)."""
    interconnect: str = "loopback"


# --------------------------------------------------------------------------------------------------
# Payloads (ARCHITECTURE.md §4 catalog)
# --------------------------------------------------------------------------------------------------


class StudyCreated(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """``init`` locked a contract: scope, search space, invariants and budget are fixed from here on."""

    name: str
    goal: str
    contract: dict[str, Any]
    """The validated, normalised contract (see ``infrarsi.study.contract``), as JSON."""
    contract_sha256: str
    workload_dir: str
    """Absolute path of the workload's git repository that trials are materialised from."""
    baseline_ref: str
    """Git commit of the untouched golden baseline (also tagged in the workload repo)."""
    locked_files: dict[str, str]
    """sha256 of every non-editable file of the workload, by repo-relative path."""
    locked_inputs: dict[str, str] = {}
    """The workload's inputs outside git (``workload.inputs``), by repo-relative path: each file's
    ``sha256:…`` or, above ``workload.inputs_hash_limit_bytes``, ``size:…,mtime_ns:…`` (``infrarsi.study.inputs``)."""
    cluster: ClusterInfo
    bank_seeds: list[str] = []
    """Bank entry ids that will seed this study's priors."""
    bank: BankResolution | None = None
    """What ``init`` took from the experience bank (priors, seeds, the study's own bank metadata); ``None``
    for a study created without consulting the bank. The modeler and the proposer read the bank only from here."""


class DoctorRequested(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    repeats: int
    steps: int | None = None


class DoctorCompleted(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The baseline's noise floor and phase profile; the search sizes its repeats from it."""

    repeats: int
    baseline_trial_ids: list[str]
    step_time_s: float
    """Median over repeats of each run's robust steady step time."""
    run_to_run_cv: float
    step_to_step_cv: float
    warmup_steps: int
    phase_fractions: dict[str, float]
    per_rank_step_s: list[float]
    stragglers: list[int]
    min_detectable_speedup: float
    """Smallest speed-up detectable at ``repeats_per_trial`` repeats (α=0.05, power 0.8)."""
    repeats_per_trial: int
    repeats_for_effect: dict[str, int] = {}
    """Repeats needed to detect a given speed-up, e.g. ``{"1.05": 4}``."""
    peak_flops_measured: float | None = None
    mfu: float | None = None
    baseline_loss_curve: list[LossPoint] = []
    interfered_runs: list[int] = []
    """Baseline runs (0-based, in ``baseline_trial_ids`` order) left out of the noise estimate as interfered
    with: their median step was ≥ 1.5× off the others' (``infrarsi.verdicts.doctor.interfered_runs``)."""
    harness_cpu_share: float | None = None
    """Mean over the baseline runs of the harness's CPU seconds (``TrialFinished.harness_cpu_s``) per second of
    trial wall time and core of the host: the share of the host's CPU InfraRSI itself took while the baseline
    was measured. ``None``: not measured (the stack runs elsewhere)."""
    host_native_dtypes: list[str] = []
    """Matmul dtypes the trials' host runs natively (a CPU host on the local backend: its instruction flags, as
    capped by ``ONEDNN_MAX_CPU_ISA`` in the job's environment; ``infrarsi.verdicts.doctor.native_matmul_dtypes``). Empty:
    not known (a GPU or a remote host). The search starts from it: bf16 autocast on a CPU without bf16 units is
    expected far slower, not faster (``KnowledgeBase.with_host``)."""


class RunRequested(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """``infrarsi run``: search this study up to ``trials`` search trials in total, ``parallel`` in flight.

    Absolute, not incremental: a later request with a larger ``trials`` extends a finished search. Both are
    capped by the contract's locked budget. (Not in the original ARCHITECTURE.md catalog: the search needs a
    trigger that is an event, so that the proposer's state stays a pure fold over the log.)
    """

    trials: int | None = None
    """Search trials for the whole study; ``None`` = the contract's ``budget.trials``."""
    parallel: int | None = None
    """Trials in flight at once; ``None`` = the contract's ``backend.parallel``."""


class TrialProposed(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    candidate: Candidate
    candidate_key: str
    kind: TrialKind
    origin: Origin
    reason: str = ""
    repeat: int = 0
    steps: int | None = None
    """Horizon override (verify runs longer); ``None`` = the contract's trial horizon."""
    prediction: Prediction | None = None
    verify_id: str | None = None
    retry_of: str | None = None
    """The trial this one runs again (an infrastructure failure, or a timing verdict taken under interference)."""
    resume_from: str | None = None
    """Verify's checkpoint restart: a fresh process resumes from the checkpoint that trial saved
    (``verify.checkpoint_restart``); ``None`` = a run from step zero."""


class TrialLaunched(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    backend: str
    workdir: str
    command: list[str]
    nodes: int
    ranks: int
    host: str
    job_id: str
    isolation: str = ""
    """What kept the job from the host: ``bwrap`` (the trial sandbox, on the launcher's host or a Slurm node),
    ``none`` (it ran as the launcher's user does), ``""`` (a backend that does not say: a pod, the simulator)."""


class TrialStep(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """One optimiser step of one rank, as the probe inside the job measured it."""

    rank: int
    world_size: int
    step: int
    loss: float | None
    """This step's mean training loss (all ranks); ``None`` when the job reported none for it (a Trainer
    that logs every k steps)."""
    step_time_s: float
    """Synchronised wall time of the whole step (data, forward, backward, optimiser, communication)."""
    phases: dict[str, float] = {}
    tokens: int
    """Tokens consumed by this step across all ranks (global batch × sequence length)."""
    optimizer_steps: int
    """Cumulative optimiser steps actually taken, counted by the probe's hook, not claimed by the job."""
    loss_tokens: int | None = None
    """Tokens that contributed to the loss in this step (all ranks)."""
    peak_memory_bytes: int
    flops: float | None = None
    mfu: float | None = None
    eval_loss: float | None = None
    eval_tokens: int | None = None
    wall_time: float = 0.0
    """Unix time at the end of the step (the probe's clock)."""
    shape: WorkloadShape | None = None
    """The model's shape, on the first record a probe writes (``None`` on the others)."""
    deterministic: bool | None = None
    """Whether torch's deterministic algorithms were on at the end of this step
    (``torch.are_deterministic_algorithms_enabled()``); ``None`` from probes that do not say."""


class DownstreamResult(msgspec.Struct, frozen=True, kw_only=True):
    """What the contract's downstream command measured on one run's final weights (``verify.downstream``)."""

    metric: str
    value: float | None = None
    """``None``: no value (the command failed, timed out, or printed no JSON object with ``metric``)."""
    error: str = ""
    """Why there is no value, with the end of the command's output."""
    wall_s: float = 0.0


class TrialFinished(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The launcher's account of a trial: how it ended and what it cost, for every trial, failed ones too."""

    status: TrialStatus
    reason: str = ""
    exit_code: int | None = None
    wall_s: float = 0.0
    ranks: int = 1
    accelerator_s: float = 0.0
    """ranks × wall time."""
    warmup_accelerator_s: float = 0.0
    steady_accelerator_s: float = 0.0
    peak_memory_bytes: int = 0
    """Highest process-tree peak seen by the launcher (RSS on CPU)."""
    censored_peak_bytes: int | None = None
    """For ``oom``: the peak seen before the kill — the memory model's censoring bound (peak > this)."""
    memory_capacity_bytes: int = 0
    steps_completed: int = 0
    step_seen_s: list[float] = []
    """Launcher's own clock (s since launch) when each step of rank 0 became visible; timing invariant."""
    output_tail: str = ""
    cpu_pressure: float | None = None
    """Share of the trial's wall time in which some task on the host waited for a CPU (Linux PSI,
    ``/proc/pressure/cpu``); ``None`` where the kernel does not report it. The timing invariant's
    interference signal."""
    harness_cpu_s: float | None = None
    """CPU seconds InfraRSI's own processes on the trial's host (the services, the bus, the command that
    started them) used while the trial ran; ``None`` where the stack does not run beside the trial. The doctor
    reports it as the harness's share of the host (``DoctorCompleted.harness_cpu_share``)."""
    infrastructure: bool = False
    """The trial failed because of the harness, not the candidate (its launcher was killed mid-trial, or
    could not handle it): it costs its accelerator time but says nothing about the candidate, which the
    proposer runs once more."""
    output_steps: list[OutputStep] = []
    """Coarse measurement only: each new step count the job's output showed (``steps_completed`` is the
    last), for a job without a probe."""
    output_losses: list[LossPoint] = []
    """Coarse measurement only: the train loss the job printed, by step count (the count its output showed
    when the loss appeared; the last print of a step wins), read by ``infrarsi.trial.joblog``'s patterns."""
    output_eval_losses: list[LossPoint] = []
    """Coarse measurement only: the eval loss the job printed, by step count."""
    output_step_times: list[PrintedStepTime] = []
    """Coarse measurement only: the step times the job printed on its step lines (``time 81.2ms``,
    ``| 812.3 ms``), in order, with when each line became visible: held against the launcher's clock (the
    timing invariant)."""
    output_tokens: int | None = None
    """Coarse measurement only: the tokens trained so far as the job last printed them (``tokens_regex``'s
    ``tokens`` group, HF's ``num_input_tokens_seen``); ``None`` when it printed none."""
    output_micro_batches: int | None = None
    """Coarse measurement only: the micro-batches run so far as the job last printed them (``tokens_regex``'s
    ``micro_batches`` group, LitGPT's ``iter N``); ``None`` when it printed none."""
    downstream: DownstreamResult | None = None
    """Verify runs under ``verify.downstream``: the evaluation command's result on this run's final weights."""


class TrialStopRequested(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Telemetry asks the launcher to stop a running search trial whose steady steps are already far slower
    than the study's incumbent (docs/trials.md, "Stopped early as slow"). At most one per trial."""

    steady_step_s: float
    """Median of the trial's steady steps so far (rank 0, after its warm-up)."""
    steady_steps: int
    """Steady steps that median is over."""
    warmup_steps: int
    incumbent_step_s: float
    """The study's fastest measured step time so far (a trial that ran ``ok`` with every invariant held)."""
    incumbent_trial: str
    threshold_step_s: float
    """The bar the last steady steps all exceeded: the incumbent × the contract's ``budget.stop_slow_factor``,
    or more where the doctor's noise floor is wider."""
    reason: str


class TrialMeasured(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Telemetry's statistics of one trial, with the invariant verdicts against the study's baseline."""

    candidate_key: str
    kind: TrialKind
    status: TrialStatus
    steps: int
    warmup_steps: int
    step_time_s: float
    """Robust centre (median) of the steady steps of the slowest rank."""
    step_time_mad_s: float
    step_time_with_warmup_s: float
    tokens_per_s: float
    mfu: float | None
    flops_per_step: float | None
    phases: dict[str, float]
    peak_memory_bytes: list[int]
    """Per rank."""
    per_rank_step_s: list[float]
    stragglers: list[int]
    loss_curve: list[LossPoint]
    eval_curve: list[LossPoint]
    optimizer_steps: int
    tokens: int
    invariants: list[InvariantResult]
    invariants_ok: bool
    """Every invariant in ``invariants`` held (those in ``unchecked_invariants`` were not checked)."""
    accelerator_s: float = 0.0
    shape: WorkloadShape | None = None
    """The model's shape as rank 0's probe reported it (``None`` from jobs without a probe)."""
    interfered: bool = False
    """Only the timing invariant failed, and the host's CPU pressure during the trial was too high to tell
    a hack from noise: the trial is re-run (as after an infrastructure failure), the candidate not rejected."""
    coarse: bool = False
    """Measured from outside (the job has no probe): wall time, exit status, process-tree memory, steps
    counted in the output, and the loss and step times it printed. Step time is the launcher's estimate;
    tokens and MFU are unknown."""
    unchecked_invariants: list[UncheckedInvariant] = []
    """The invariants this trial could not check, with why: never counted as held."""
    loss_from_log: bool = False
    """Coarse: ``loss_curve``/``eval_curve`` were read from the job's printed output (not reported by a probe)."""
    deterministic: bool | None = None
    """Torch's deterministic algorithms were on at every step the probe reported (``False``: off at some step;
    ``None``: no step said). Checked at verify under ``invariants.parity: bitwise``."""


class ModelUpdated(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    n_trials: int
    n_oom: int
    fit_seconds: float
    noise_std_log: float
    time_effects: list[Effect]
    memory_effects: list[Effect]
    best_candidate_key: str | None = None
    best_predicted_step_s: float | None = None
    diagnostics: dict[str, float] = {}


class VerifyRequested(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    candidates: list[Candidate]
    repeats: int
    steps: int | None = None
    reason: str = ""


class VerifyCompleted(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    verify_id: str
    candidate: Candidate
    candidate_key: str
    passes: int
    promotable: bool
    speedup: float
    ci_low: float
    ci_high: float
    baseline_step_s: float
    candidate_step_s: float
    mfu_before: float | None
    mfu_after: float | None
    invariants: list[InvariantResult]
    failed_invariants: list[str]
    trial_ids: list[str]
    unchecked_invariants: list[str] = []
    """Invariants no run of the round could check (coarse measurement of a job without a probe): the round
    is judged on the others and this list says so, everywhere the verdict is shown."""


class ReportPublished(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    out_dir: str
    files: list[str]
    winners: list[str]


class ApprovalGranted(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    candidate_key: str
    role: str
    approver: str
    action_classes: list[str]
    note: str = ""
    evidence_sha256: str = ""
    """The evidence the approver saw (``approvals.evidence_sha256``: contract, baseline, verification)."""
    statement: str = ""
    """The exact text signed (``approvals.Statement``); empty when unsigned."""
    signature: str = ""
    """OpenSSH signature (``ssh-keygen -Y sign -n infrarsi-approval``) of ``statement``; empty when unsigned."""


class PatchPromoted(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    candidate_key: str
    repo: str
    branch: str
    commit: str
    files_changed: list[str]
    launch_changes: dict[str, KnobValue]


class BankMeta(msgspec.Struct, frozen=True, kw_only=True):
    """What decides whether a lesson transfers (issue 7)."""

    accelerator: str
    generation: str
    device_memory_bytes: int
    interconnect: str
    nodes: int
    devices_per_node: int
    parallelism: dict[str, int] = {}
    model_family: str = ""
    model_params: float = 0.0
    seq_len: int = 0
    global_batch: int = 0
    micro_batch: int = 0
    precision: str = ""


class BankPrior(msgspec.Struct, frozen=True, kw_only=True):
    """One encoded feature's prior for a new study: the knowledge base shrunk toward similar bank entries."""

    mean: float
    """Log-ratio (step time or peak memory) of the feature, as the time/memory model encodes it."""
    std: float
    entries: list[str] = []
    """Bank entry ids whose evidence was pooled into this prior."""
    similarity: float = 0.0
    """Highest similarity among those entries."""


class BankMatch(msgspec.Struct, frozen=True, kw_only=True):
    """A bank entry similar enough to inform a new study, and why (``bank.similarity.explain_seeds``)."""

    entry_id: str
    similarity: float
    why: str
    """The weakest similarity factors, e.g. ``generation 0.60 (adjacent generation (ampere vs hopper))``."""


class BankSeedCandidate(msgspec.Struct, frozen=True, kw_only=True):
    """A similar study's winner, mapped into this study's space, for the proposer's initial design."""

    candidate: Candidate
    """In this study's terms: launch keys that differ from its golden launch file, and patch ids."""
    entry_id: str
    similarity: float
    score: float
    """similarity × decay^rank of the winner in its entry; seeds are listed best first."""
    reason: str


class BankResolution(msgspec.Struct, frozen=True, kw_only=True):
    """The bank as resolved once, at ``init``, for one study.

    The bank lives in its own stream (``IRSI_BANK``) and a replay of the lifecycle stream cannot interleave it
    deterministically; so ``init`` computes what the study takes from the bank and records it in
    ``StudyCreated``. Features absent from ``time_priors``/``memory_priors`` keep the built-in prior.
    """

    meta: BankMeta
    """What this study is matched on, now and when its own entry is distilled."""
    matches: list[BankMatch] = []
    """Entries above the similarity threshold, most similar first."""
    time_priors: dict[str, BankPrior] = {}
    """By encoded feature name (``micro_batch_size:log2``, ``attention=sdpa``, ``patch:<id>``)."""
    memory_priors: dict[str, BankPrior] = {}
    seeds: list[BankSeedCandidate] = []
    """Proposed first, with origin ``bank``, best first."""


class BankFailure(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A lesson a study paid for: an OOM boundary, a patch conflict, an invariant violation."""

    kind: str
    """The trial status (``oom``, ``patch_conflict``, ``invariant_violation``, ...)."""
    candidate: Candidate
    detail: str
    censored_peak_bytes: float | None = None
    """OOM only: the peak the run reached before it died (a lower bound of what it needed)."""
    capacity_bytes: float | None = None
    """OOM only: the device memory it had."""


class BankEntry(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    entry_id: str
    origin_study: str
    meta: BankMeta
    time_effects: list[Effect]
    memory_effects: list[Effect]
    winners: list[Candidate] = []
    failures: list[BankFailure] = []
    """OOM boundaries, conflicts, invariant violations."""


class StudyFinished(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    reason: str
    trials: int
    accelerator_s: float
    best_candidate_key: str | None = None
    best_speedup: float | None = None


class StudyCancelled(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """``infrarsi cancel STUDY``: the study stops here. The launcher stops the study's running trials (each ends
    ``cancelled``, its accelerator time kept) and finishes its queued ones unrun; the proposer proposes nothing
    more and the verifier plans no further round until a ``StudyResumed``."""

    reason: str
    """Why, as the user gave it (``--reason``); recorded for the audit trail."""
    by: str = ""
    """Who asked: the CLI user and host (``user@host``)."""


class StudyResumed(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """``infrarsi resume STUDY``: a cancelled or stalled study goes on from its log. The proposer runs the
    search trials the cancel cut short once more (outside the trial budget: their candidates were never
    measured) and fills its slots again, or asks again for the verifications that had no final verdict."""

    reason: str = ""
    by: str = ""


class PromotionFollowed(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """``infrarsi follow STUDY``: where a promoted branch stands against the workload repository's main line,
    recorded when it changed since the last look (``infrarsi.verdicts.promotions``)."""

    candidate_key: str
    branch: str
    commit: str
    """The promoted commit (``PatchPromoted.commit``)."""
    mainline: str
    """The branch it was followed against (``main`` unless told)."""
    mainline_head: str
    """The main line's commit when it was looked at."""
    state: Literal["open", "merged", "reverted", "gone"]
    """``open``: not on the main line; ``merged``: its change is on the main line (merged, fast-forwarded,
    cherry-picked or squashed); ``reverted``: merged, then undone on the main line; ``gone``: neither the
    branch nor the commit exists any more and the change is not on the main line."""
    merge_commit: str | None = None
    """The main line's commit that brought the change in (a merge commit, the commit itself after a
    fast-forward, or the squashed/cherry-picked copy)."""
    revert_commit: str | None = None
    """The main line's commit that undid it."""
    detail: str = ""


class SmokeCompleted(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """``infrarsi smoke STUDY``: a short run of the merged commit, judged against the last verified numbers."""

    candidate_key: str
    commit: str
    """The main-line commit that ran (the merge commit)."""
    passed: bool
    verdict: str
    """One line: what passed or what did not, with the numbers."""
    steps: int
    step_time_s: float | None
    """Median steady step time of the smoke run; ``None`` when it did not run to a measurement."""
    verified_step_s: float
    """The candidate's step time in its last promotable verification round."""
    tolerance: float
    """The slowest it may be, as a fraction over ``verified_step_s``."""
    status: TrialStatus = "ok"
    exit_code: int | None = None
    loss_final: float | None = None
    accelerator_s: float = 0.0


# --------------------------------------------------------------------------------------------------
# The agent: what a language model was asked and what it answered (libs/infrarsi/agent)
# --------------------------------------------------------------------------------------------------

AgentPurpose = Literal["contract", "proposals"]
"""What the model was asked for: a contract draft (``init --ask``) or candidates, diffs and priors."""

AgentRefusalKind = Literal[
    "not_json",
    "malformed",
    "outside_space",
    "contract_violation",
    "scope_violation",
    "patch_conflict",
    "locked_file_changed",
    "unknown_feature",
    "widens_scope",
    "timeout",
    "http_error",
    "budget_exceeded",
]
"""Why part (or all) of a model's answer was refused: a name a test and a report can point at."""


class AgentMessage(msgspec.Struct, frozen=True, kw_only=True):
    """One chat message as sent, secrets redacted."""

    role: Literal["system", "user", "assistant"]
    content: str


class AgentKnobProposal(msgspec.Struct, frozen=True, kw_only=True):
    """A candidate the model proposed and the checks let through (the contract still re-checks it)."""

    candidate: Candidate
    reason: str = ""


class AgentPatch(msgspec.Struct, frozen=True, kw_only=True):
    """A unified diff the model proposed that passed the library's patch checks on the golden baseline; a
    patch of the study from here on, ``patch_id`` ``llm-<sha256 prefix of the diff>``."""

    patch_id: str
    diff: str
    description: str
    files: list[str]
    reason: str = ""
    expected_time_log_ratio: float = 0.0
    """The model's expected log(candidate / baseline) of step time (negative = faster)."""
    expected_memory_log_ratio: float = 0.0
    prior_std: float = 0.3
    """Std of the prior the search puts on this patch: the model's stated confidence, widened by its weight."""


class AgentPrior(msgspec.Struct, frozen=True, kw_only=True):
    """A knowledge-base override the model proposed: an encoded feature's effect on log step time or memory, or
    (``target`` ``invariant``) the probability that a setting breaks an invariant of this job."""

    feature: str
    """As the models encode it: ``autocast_dtype=bfloat16``, ``micro_batch_size:log2``, ``patch:<id>``."""
    target: Literal["time", "memory", "invariant"] = "time"
    mean: float
    """time/memory: the effect in log units; invariant: P(the setting breaks an invariant), in [0.01, 0.9]."""
    std: float
    """The model's stated std, divided by sqrt(weight): a prior that measurements overrule (unused for
    ``invariant``: one run that keeps every invariant clears the setting whatever the model said)."""
    weight: float
    reason: str = ""


class AgentRefusal(msgspec.Struct, frozen=True, kw_only=True):
    """A part of an answer that was refused, by name."""

    kind: AgentRefusalKind
    item: str
    """What was refused: ``answer``, ``candidate 2``, ``diff 1``, ``prior micro_batch_size:log2``."""
    detail: str


class AgentAsked(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """The proposer (or ``init --ask``) asked the study's language model something; the prompt as sent,
    secrets redacted. Replay shows it; it never sends it again."""

    ask_id: str
    purpose: AgentPurpose
    model: str
    endpoint: str
    """Base URL of the OpenAI-compatible server (no credentials)."""
    messages: list[AgentMessage]
    max_tokens: int
    tokens_spent_before: int = 0
    """Tokens of the study's ``budget.llm_tokens`` spent by earlier exchanges."""


class AgentAnswered(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """What the model said to ``ask_id`` (redacted) and what of it passed the checks. The proposer's fold
    reads proposals only from here, so a replay reproduces them without calling the model."""

    ask_id: str
    ok: bool
    """False when no usable answer came back (``error`` names why); refusals of parts leave it True."""
    text: str = ""
    error: AgentRefusalKind | None = None
    detail: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    attempts: int = 1
    latency_s: float = 0.0
    candidates: list[AgentKnobProposal] = []
    patches: list[AgentPatch] = []
    priors: list[AgentPrior] = []
    refused: list[AgentRefusal] = []
    contract: dict[str, Any] | None = None
    """``purpose: contract``: the drafted contract as validated (``None`` if refused)."""

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


Payload = (
    StudyCreated
    | DoctorRequested
    | DoctorCompleted
    | RunRequested
    | TrialProposed
    | TrialLaunched
    | TrialStep
    | TrialFinished
    | TrialStopRequested
    | TrialMeasured
    | ModelUpdated
    | VerifyRequested
    | VerifyCompleted
    | ReportPublished
    | ApprovalGranted
    | PatchPromoted
    | BankEntry
    | StudyFinished
    | StudyCancelled
    | StudyResumed
    | PromotionFollowed
    | SmokeCompleted
    | AgentAsked
    | AgentAnswered
)

PAYLOAD_TYPES: tuple[type, ...] = Payload.__args__
EVENT_TYPES: tuple[str, ...] = tuple(t.__name__ for t in PAYLOAD_TYPES)


PayloadT = TypeVar("PayloadT")


class Envelope(msgspec.Struct, Generic[PayloadT], frozen=True, kw_only=True):
    """The envelope of every message on the bus, over a payload type: ``Event`` is the one services use; the
    event log's fast paths decode ``Envelope[msgspec.Raw]`` (payload kept as JSON text) and an envelope whose
    payload can only be a ``TrialStep`` (``eventlog.decoding``)."""

    event_id: str
    type: str
    """The payload's tag (its class name); duplicated here for routing and SQL."""
    study_id: str
    trial_id: str | None = None
    cluster_id: str
    source: str
    """The service or command that published it."""
    ts: datetime
    schema_version: int = SCHEMA_VERSION
    payload: PayloadT


class Event(Envelope[Payload], frozen=True, kw_only=True):
    """The envelope of every message on the bus."""


class DeadLetter(msgspec.Struct, frozen=True, kw_only=True):
    """What a service publishes on ``irsi.deadletter.<service>`` for a message it could not decode."""

    service: str
    subject: str
    error: str
    raw: bytes
    """The message, byte for byte (base64 in JSON), cut to its first ``DEADLETTER_RAW_MAX`` bytes."""
    stream_seq: int | None = None
    ts: datetime
    raw_size: int | None = None
    """The whole message's size in bytes (``None`` in letters written before copies were cut)."""
    raw_sha256: str = ""
    """SHA-256 of the whole message: identifies it when ``raw`` holds only its start."""


# --------------------------------------------------------------------------------------------------
# Construction, encoding, decoding
# --------------------------------------------------------------------------------------------------


def make_event(
    payload: Payload,
    *,
    study_id: str,
    source: str,
    trial_id: str | None = None,
    cluster_id: str | None = None,
    event_id: str | None = None,
) -> Event:
    """Wrap a payload in an envelope; ``event_id`` defaults to a fresh ULID, ``cluster_id`` to ``local``
    (a process passes its ``Settings.cluster``)."""
    return Event(
        event_id=event_id or new_id(),
        type=type(payload).__name__,
        study_id=study_id,
        trial_id=trial_id,
        cluster_id=cluster_id or "local",
        source=source,
        ts=datetime.now(UTC),
        payload=payload,
    )


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(Event)


def encode(event: Event) -> bytes:
    return _encoder.encode(event)


def decode(data: bytes) -> Event:
    """Decode and validate one envelope; raises ``msgspec.ValidationError``/``DecodeError`` on bad input.

    The envelope's ``type`` must agree with its payload's tag.
    """
    try:
        event = _decoder.decode(data)
    except RecursionError:
        # msgspec recurses once per nesting level of a field it skips: a deep array is a bad message,
        # not a crash of the consumer (or of every replay that meets it again).
        raise msgspec.DecodeError("JSON nested too deeply") from None
    if event.type != type(event.payload).__name__:
        raise msgspec.ValidationError(
            f"envelope type {event.type!r} does not match payload type {type(event.payload).__name__!r}"
        )
    return event


def decode_or_none(data: bytes, types: tuple[type, ...] | None = None) -> Event | None:
    """The event in ``data``, or ``None`` when it does not decode (a dead letter, a torn line of a killed job)
    or, given ``types``, when its payload is of another type."""
    try:
        event = decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return event if types is None or isinstance(event.payload, types) else None


def decode_each(raw: Iterable[bytes], types: tuple[type, ...] | None = None) -> Iterator[Event]:
    """Every message of ``raw`` that decodes (and, given ``types``, has one of those payload types), in order."""
    for data in raw:
        event = decode_or_none(data, types)
        if event is not None:
            yield event


def json_schema() -> dict[str, Any]:
    """JSON Schema of the envelope (with every payload), for ``schemas/events.schema.json``."""
    return msgspec.json.schema(Event)
