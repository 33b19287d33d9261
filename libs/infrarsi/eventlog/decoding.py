"""Stream messages into columnar batches (``decode_batch`` → ``Batch``): the typed decoders, the fast path that
decodes a ``TrialStep`` payload straight into its struct, and the rows of undecodable messages and dead letters.
Pure: must not touch DuckDB or the bus."""
from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec
import numpy as np

from infrarsi import events as ev
from infrarsi.bus import subjects
from infrarsi.bus.client import TELEMETRY_STREAM
from infrarsi.bus.reader import StreamMessage
from infrarsi.eventlog.schema import _STUDY_COLUMNS, _TRIAL_COLUMNS

# --------------------------------------------------------------------------------------------------
# Decoding
# --------------------------------------------------------------------------------------------------


_Envelope = ev.Envelope[msgspec.Raw]
"""``events.Event`` with the payload left undecoded: envelope columns and the payload's JSON text."""


class _NotAStep(msgspec.Struct, tag="_NotAStep"):
    """Second member of the step decoder's union: makes the payload's ``type`` tag required, as in ``Event``."""


_StepEvent = ev.Envelope[ev.TrialStep | _NotAStep]
"""``events.Event`` whose payload can only be a ``TrialStep``: one pass over a telemetry message.

Decoding succeeds only where ``events.decode`` would give a ``TrialStep`` payload (a payload of any other type
fails on its tag); ``decode_batch`` also checks the envelope's ``type``, and sends anything else down the
general path.
"""


_envelope_decoder = msgspec.json.Decoder(_Envelope)
# The fast path for 9 of 10 messages: the payload decoded straight into ``TrialStep``, so it is validated
# exactly as ``events.decode`` would, without building an ``Event`` or dispatching over the whole union.
_step_decoder = msgspec.json.Decoder(ev.TrialStep | _NotAStep)
_step_event_decoder = msgspec.json.Decoder(_StepEvent)
_dead_letter_decoder = msgspec.json.Decoder(ev.DeadLetter)
_json = msgspec.json.Encoder()
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def _micros(ts: datetime) -> int:
    """Microseconds since the epoch; a naive time (allowed by the envelope) is read as UTC."""
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=UTC)
    return (ts - _EPOCH) // _MICROSECOND


def _js(value: Any) -> str:
    return _json.encode(value).decode()


def decode_step(data: bytes) -> tuple[_Envelope, ev.TrialStep]:
    """Decode a ``TrialStep`` message with the same validation as ``events.decode``, only faster."""
    envelope = _envelope_decoder.decode(data)
    payload = _step_decoder.decode(envelope.payload)
    if envelope.type != "TrialStep" or not isinstance(payload, ev.TrialStep):
        raise msgspec.ValidationError(
            f"envelope type {envelope.type!r} does not match payload type {type(payload).__name__!r}"
        )
    return envelope, payload


class _Stage:
    """Rows of one table, column by column, for one ``INSERT … SELECT``."""

    def __init__(self, *columns: str) -> None:
        self.columns = columns
        self.rows: list[dict[str, Any]] = []

    def add(self, **values: Any) -> None:
        self.rows.append(values)

    def __len__(self) -> int:
        return len(self.rows)

    def arrays(self) -> dict[str, np.ndarray]:
        """Columns of the staged rows; a column a row did not set is NULL. Each row sets a few of the
        ``trials`` table's 60 columns, so this walks what was set, not every column of every row."""
        n = len(self.rows)
        columns: dict[str, list[Any]] = {name: [None] * n for name in self.columns}
        for i, row in enumerate(self.rows):
            for name, value in row.items():
                columns[name][i] = value
        return {name: _array(values) for name, values in columns.items()}


def _array(values: list[Any]) -> np.ndarray:
    """A numpy column DuckDB can scan: object dtype keeps ``None`` as NULL (a float array would make it NaN)."""
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


@dataclass
class Batch:
    """One stream's messages decoded into staged columns; ``last_seq`` is the highest sequence it covers."""

    stream: str
    first_seq: int = 0
    last_seq: int = 0
    # lifecycle_events: every envelope but telemetry TrialSteps (plain lists rather than a _Stage)
    seq: list[int] = field(default_factory=list)
    subject: list[str] = field(default_factory=list)
    event_id: list[str] = field(default_factory=list)
    type: list[str] = field(default_factory=list)
    study_id: list[str] = field(default_factory=list)
    trial_id: list[str | None] = field(default_factory=list)
    cluster_id: list[str] = field(default_factory=list)
    source: list[str] = field(default_factory=list)
    ts_us: list[int] = field(default_factory=list)
    schema_version: list[int] = field(default_factory=list)
    payload: list[str] = field(default_factory=list)
    # steps (with their envelopes: ``events`` shows them through a view): validated messages, kept as text
    step_seq: list[int] = field(default_factory=list)
    step_subject: list[str] = field(default_factory=list)
    step_json: list[str] = field(default_factory=list)
    """The message as published; DuckDB projects its columns (``_INSERTS["steps"]``) after msgspec validated it."""
    step_ts_us: list[int] = field(default_factory=list)
    studies: _Stage = field(default_factory=lambda: _Stage("seq", "study_id", *_STUDY_COLUMNS))
    trials: _Stage = field(default_factory=lambda: _Stage("seq", "study_id", "trial_id", *_TRIAL_COLUMNS))
    models: _Stage = field(default_factory=lambda: _Stage(*_MODEL_COLUMNS))
    verifications: _Stage = field(default_factory=lambda: _Stage(*_VERIFICATION_COLUMNS))
    bank: _Stage = field(default_factory=lambda: _Stage(*_BANK_COLUMNS))
    dead_letters: _Stage = field(
        default_factory=lambda: _Stage(
            "seq", "subject", "service", "original_subject", "original_stream_seq", "error", "raw", "ts_us"
        )
    )
    undecodable: _Stage = field(default_factory=lambda: _Stage("seq", "subject", "error", "raw"))
    tables: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    """Ready-to-insert columns per table, filled by ``finish`` (what the writer's thread scans)."""

    def finish(self) -> Batch:
        """Turn the staged rows into numpy columns (on the decoding side: the writer then only runs DuckDB)."""
        tables = self.tables
        if self.seq:
            tables["lifecycle_events"] = _events_arrays(self)
        if self.step_seq:
            tables["steps"] = {
                "seq": np.array(self.step_seq, dtype=np.uint64),
                "subject": _array(self.step_subject),
                "json": _array(self.step_json),
                "ts_us": np.array(self.step_ts_us, dtype=np.int64),
            }
        for table in ("studies", "trials", "models", "verifications", "bank", "dead_letters", "undecodable"):
            stage: _Stage = getattr(self, table)
            if len(stage):
                tables[table] = stage.arrays()
        return self


_MODEL_COLUMNS: tuple[str, ...] = (
    "seq", "event_id", "study_id", "ts_us", "n_trials", "n_oom", "fit_seconds", "noise_std_log",
    "best_candidate_key", "best_predicted_step_s", "time_effects", "memory_effects", "diagnostics",
)
_VERIFICATION_COLUMNS: tuple[str, ...] = (
    "seq", "event_id", "study_id", "ts_us", "verify_id", "candidate_key", "knobs", "patches", "passes",
    "promotable", "speedup", "ci_low", "ci_high", "baseline_step_s", "candidate_step_s", "mfu_before",
    "mfu_after", "invariants", "failed_invariants", "trial_ids",
)
_BANK_COLUMNS: tuple[str, ...] = (
    "seq", "event_id", "entry_id", "origin_study", "cluster_id", "ts_us", "accelerator", "generation",
    "device_memory_bytes", "interconnect", "nodes", "devices_per_node", "model_family", "model_params",
    "seq_len", "global_batch", "micro_batch", "precision", "meta", "time_effects", "memory_effects",
    "winners", "failures",
)


def _ts(us: int) -> datetime:
    return _EPOCH + us * _MICROSECOND


_gc_lock = threading.Lock()
_gc_pauses = 0
_gc_was_enabled = False
"""Whether the collector was on when the outermost pause began (it is turned back on only then)."""


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a batch is decoded.

    Decoding allocates ~10 objects per message (structs, dicts, strings) and frees them all once the batch
    is written; none forms a cycle, so reference counting frees them anyway. With the collector on, every
    700 allocations start a collection, and the older generations are traversed again and again: decoding
    90 000 step messages took 0.34–0.43 s of CPU with it on, 0.20 s with it paused. Nested and concurrent
    pauses (threads) are counted; the collector resumes (if it was on) when the last one ends.
    """
    global _gc_pauses, _gc_was_enabled
    with _gc_lock:
        _gc_pauses += 1
        if _gc_pauses == 1:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_was_enabled:
                gc.enable()


def decode_batch(stream: str, msgs: Sequence[StreamMessage], after_seq: int = 0) -> Batch:
    """Decode messages (in stream order) with sequence above ``after_seq`` into a ``Batch``.

    Never raises on message content: what fails decoding is staged for ``undecodable``. Telemetry
    ``TrialStep`` messages (9 in 10) take one typed pass (``_StepEvent``); everything else, and anything
    the fast pass rejects, goes through ``_decode_one`` (the full ``events.decode``). The batch comes back
    finished: every table's rows as numpy columns, so the writer's thread only runs DuckDB.
    """
    batch = Batch(stream)
    with _gc_paused():
        _decode_into(batch, msgs, after_seq)
        return batch.finish()


async def decode_batch_yielding(stream: str, msgs: Sequence[StreamMessage], after_seq: int = 0,
                                slice_size: int = 2_000) -> Batch:
    """``decode_batch``, giving the event loop a turn every ``slice_size`` messages (~10 ms).

    The stream reader shares the loop: while a batch decodes, it must still drain the socket and answer
    the server's flow-control requests, or the server pauses and the next batch arrives late.
    """
    batch = Batch(stream)
    for i in range(0, len(msgs), slice_size):
        with _gc_paused():
            _decode_into(batch, msgs[i:i + slice_size], after_seq)
        await asyncio.sleep(0)
    with _gc_paused():
        return batch.finish()


def _decode_into(batch: Batch, msgs: Sequence[StreamMessage], after_seq: int) -> None:
    """Decode messages (in stream order, after those already in ``batch``) into ``batch``."""
    stream = batch.stream
    seq_, subject_, json_, ts_ = (batch.step_seq.append, batch.step_subject.append, batch.step_json.append,
                                  batch.step_ts_us.append)
    step_decode, step_type = _step_event_decoder.decode, ev.TrialStep
    epoch, microsecond = _EPOCH, _MICROSECOND
    telemetry = stream == TELEMETRY_STREAM
    first, last = batch.first_seq, batch.last_seq
    for seq, subject, data in msgs:
        if seq <= after_seq:
            continue
        if not first:
            first = seq
        last = seq
        if telemetry:
            try:
                step = step_decode(data)
                if step.type == "TrialStep" and type(step.payload) is step_type:
                    text = str(data, "utf-8")
                    try:
                        ts_us = (step.ts - epoch) // microsecond
                    except TypeError:  # a naive time (the envelope allows it): read as UTC
                        ts_us = _micros(step.ts)
                    seq_(seq)
                    subject_(subject)
                    json_(text)
                    ts_(ts_us)
                    continue
            except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, RecursionError):
                pass
        _decode_one(batch, seq, subject, data)
    batch.first_seq, batch.last_seq = first, last


def _decode_one(batch: Batch, seq: int, subject: str, data: bytes) -> None:
    """One message by the general path: dead letter, event (lifecycle row, or a step), or undecodable."""
    if subjects.is_deadletter(subject):
        _stage_dead_letter(batch, seq, subject, data)
        return
    try:
        envelope = _envelope_decoder.decode(data)
        if envelope.type == "TrialStep":
            step = _step_decoder.decode(envelope.payload)
            if type(step) is not ev.TrialStep:
                raise msgspec.ValidationError(
                    f"envelope type 'TrialStep' does not match payload type {type(step).__name__!r}"
                )
            event = None
        else:
            event = ev.decode(data)  # full validation; lifecycle events are the rare ones
        ts_us = _micros(envelope.ts)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError, RecursionError) as exc:
        # RecursionError: a message nested thousands deep (msgspec recurses per level it skips)
        batch.undecodable.add(seq=seq, subject=subject, error=f"{type(exc).__name__}: {exc}", raw=data)
        return
    if event is None and batch.stream == TELEMETRY_STREAM:
        batch.step_seq.append(seq)
        batch.step_subject.append(subject)
        batch.step_json.append(str(data, "utf-8"))
        batch.step_ts_us.append(ts_us)
        return
    # A TrialStep outside the telemetry stream (published there by hand) is kept as a lifecycle row only:
    # ``steps`` holds the telemetry stream, whose sequences it is keyed by.
    batch.seq.append(seq)
    batch.subject.append(subject)
    batch.event_id.append(envelope.event_id)
    batch.type.append(envelope.type)
    batch.study_id.append(envelope.study_id)
    batch.trial_id.append(envelope.trial_id)
    batch.cluster_id.append(envelope.cluster_id)
    batch.source.append(envelope.source)
    batch.ts_us.append(ts_us)
    batch.schema_version.append(envelope.schema_version)
    batch.payload.append(str(envelope.payload, "utf-8"))
    if event is not None:
        _stage_lifecycle(batch, seq, event, ts_us)


def _stage_dead_letter(batch: Batch, seq: int, subject: str, data: bytes) -> None:
    try:
        letter = _dead_letter_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
        batch.undecodable.add(seq=seq, subject=subject, error=f"{type(exc).__name__}: {exc}", raw=data)
        return
    batch.dead_letters.add(
        seq=seq, subject=subject, service=letter.service, original_subject=letter.subject,
        original_stream_seq=letter.stream_seq, error=letter.error, raw=letter.raw, ts_us=_micros(letter.ts),
    )


def _stage_lifecycle(batch: Batch, seq: int, event: ev.Event, ts_us: int) -> None:
    """One handler per lifecycle payload type: the columns it sets in ``studies``/``trials`` or its row."""
    ts = _ts(ts_us)
    study, trial = event.study_id, event.trial_id
    match event.payload:
        case ev.StudyCreated() as p:
            batch.studies.add(
                seq=seq, study_id=study, cluster_id=event.cluster_id, name=p.name, goal=p.goal,
                contract=_js(p.contract), contract_sha256=p.contract_sha256, workload_dir=p.workload_dir,
                baseline_ref=p.baseline_ref, accelerator=p.cluster.accelerator, cluster=_js(p.cluster),
                bank_seeds=_js(p.bank_seeds), created_at=ts,
            )
        case ev.DoctorCompleted() as p:
            batch.studies.add(
                seq=seq, study_id=study, doctor_repeats=p.repeats, baseline_trial_ids=_js(p.baseline_trial_ids),
                baseline_step_time_s=p.step_time_s, run_to_run_cv=p.run_to_run_cv,
                step_to_step_cv=p.step_to_step_cv, warmup_steps=p.warmup_steps,
                phase_fractions=_js(p.phase_fractions), stragglers=_js(p.stragglers),
                min_detectable_speedup=p.min_detectable_speedup, repeats_per_trial=p.repeats_per_trial,
                peak_flops_measured=p.peak_flops_measured, baseline_mfu=p.mfu, doctor_completed_at=ts,
            )
        case ev.StudyFinished() as p:
            batch.studies.add(
                seq=seq, study_id=study, finish_reason=p.reason, trials=p.trials, accelerator_s=p.accelerator_s,
                best_candidate_key=p.best_candidate_key, best_speedup=p.best_speedup, finished_at=ts,
            )
        case ev.TrialProposed() as p if trial:
            batch.trials.add(
                seq=seq, study_id=study, trial_id=trial, cluster_id=event.cluster_id,
                candidate_key=p.candidate_key, knobs=_js(p.candidate.knobs), patches=_js(p.candidate.patches),
                kind=p.kind, origin=p.origin, reason=p.reason, repeat=p.repeat, horizon_steps=p.steps,
                verify_id=p.verify_id, predicted_step_time_s=p.prediction.step_time_s if p.prediction else None,
                prediction=_js(p.prediction) if p.prediction else None, proposed_at=ts,
            )
        case ev.TrialLaunched() as p if trial:
            batch.trials.add(
                seq=seq, study_id=study, trial_id=trial, cluster_id=event.cluster_id, backend=p.backend,
                host=p.host, job_id=p.job_id, nodes=p.nodes, ranks=p.ranks, launched_at=ts,
            )
        case ev.TrialFinished() as p if trial:
            batch.trials.add(
                seq=seq, study_id=study, trial_id=trial, cluster_id=event.cluster_id, status=p.status,
                finish_status=p.status, finish_reason=p.reason, exit_code=p.exit_code, wall_s=p.wall_s,
                accelerator_s=p.accelerator_s, warmup_accelerator_s=p.warmup_accelerator_s,
                steady_accelerator_s=p.steady_accelerator_s, launcher_peak_memory_bytes=p.peak_memory_bytes,
                censored_peak_bytes=p.censored_peak_bytes, memory_capacity_bytes=p.memory_capacity_bytes,
                steps_completed=p.steps_completed, finished_at=ts,
            )
        case ev.TrialMeasured() as p if trial:
            batch.trials.add(
                seq=seq, study_id=study, trial_id=trial, cluster_id=event.cluster_id,
                candidate_key=p.candidate_key, kind=p.kind, status=p.status, step_time_s=p.step_time_s,
                step_time_mad_s=p.step_time_mad_s, step_time_with_warmup_s=p.step_time_with_warmup_s,
                tokens_per_s=p.tokens_per_s, mfu=p.mfu, flops_per_step=p.flops_per_step, phases=_js(p.phases),
                peak_memory_bytes=max(p.peak_memory_bytes, default=None),
                peak_memory_per_rank=_js(p.peak_memory_bytes), per_rank_step_s=_js(p.per_rank_step_s),
                stragglers=_js(p.stragglers), measured_steps=p.steps, warmup_steps=p.warmup_steps,
                optimizer_steps=p.optimizer_steps, tokens=p.tokens,
                final_loss=p.loss_curve[-1].loss if p.loss_curve else None, invariants_ok=p.invariants_ok,
                invariants=_js(p.invariants), failed_invariants=_js([i.name for i in p.invariants if not i.ok]),
                measured_accelerator_s=p.accelerator_s, measured_at=ts,
            )
        case ev.ModelUpdated() as p:
            batch.models.add(
                seq=seq, event_id=event.event_id, study_id=study, ts_us=ts_us, n_trials=p.n_trials,
                n_oom=p.n_oom, fit_seconds=p.fit_seconds, noise_std_log=p.noise_std_log,
                best_candidate_key=p.best_candidate_key, best_predicted_step_s=p.best_predicted_step_s,
                time_effects=_js(p.time_effects), memory_effects=_js(p.memory_effects),
                diagnostics=_js(p.diagnostics),
            )
        case ev.VerifyCompleted() as p:
            batch.verifications.add(
                seq=seq, event_id=event.event_id, study_id=study, ts_us=ts_us, verify_id=p.verify_id,
                candidate_key=p.candidate_key, knobs=_js(p.candidate.knobs), patches=_js(p.candidate.patches),
                passes=p.passes, promotable=p.promotable, speedup=p.speedup, ci_low=p.ci_low, ci_high=p.ci_high,
                baseline_step_s=p.baseline_step_s, candidate_step_s=p.candidate_step_s,
                mfu_before=p.mfu_before, mfu_after=p.mfu_after, invariants=_js(p.invariants),
                failed_invariants=_js(p.failed_invariants), trial_ids=_js(p.trial_ids),
            )
        case ev.BankEntry() as p:
            m = p.meta
            batch.bank.add(
                seq=seq, event_id=event.event_id, entry_id=p.entry_id, origin_study=p.origin_study,
                cluster_id=event.cluster_id, ts_us=ts_us, accelerator=m.accelerator, generation=m.generation,
                device_memory_bytes=m.device_memory_bytes, interconnect=m.interconnect, nodes=m.nodes,
                devices_per_node=m.devices_per_node, model_family=m.model_family, model_params=m.model_params,
                seq_len=m.seq_len, global_batch=m.global_batch, micro_batch=m.micro_batch,
                precision=m.precision, meta=_js(m), time_effects=_js(p.time_effects),
                memory_effects=_js(p.memory_effects), winners=_js(p.winners), failures=_js(p.failures),
            )
        case _:
            pass  # in ``events`` only (requests, approvals, reports, promotions, trial events without a trial)


def _events_arrays(batch: Batch) -> dict[str, np.ndarray]:
    return {
        "seq": np.array(batch.seq, dtype=np.uint64),
        "subject": _array(batch.subject),
        "event_id": _array(batch.event_id),
        "type": _array(batch.type),
        "study_id": _array(batch.study_id),
        "trial_id": _array(batch.trial_id),
        "cluster_id": _array(batch.cluster_id),
        "source": _array(batch.source),
        "ts_us": np.array(batch.ts_us, dtype=np.int64),
        "schema_version": np.array(batch.schema_version, dtype=np.int32),
        "payload": _array(batch.payload),
    }
