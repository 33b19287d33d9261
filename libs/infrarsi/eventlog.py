"""The analyst database: a DuckDB projection of the three streams, rebuilt deterministically by replay.

Owns the analyst schema (``events`` — a view over ``lifecycle_events`` and ``steps`` —, ``studies``, ``trials``,
``steps``, ``failures``, ``models``, ``verifications``, ``bank``, ``dead_letters``, ``undecodable``; see
``SCHEMA``), decoding stream messages into
columnar batches, applying a batch idempotently, the fast in-order stream reader, ``replay``, and publishing
a read-only snapshot of the file for analysts (docs/analytics.md).

Rules it keeps (STYLE.md rule 3, the eventsourcing projection example):

- **Idempotent by stream sequence.** ``_positions(stream, last_seq)`` is updated in the same transaction as
  the rows of a batch; every insert takes only messages with ``seq > last_seq`` as read inside that
  transaction, so re-applying an old batch (or a half-old one) changes nothing.
- **Deterministic.** Every column comes from the log (no wall clock, no row ids); ``trials``/``studies``
  take, per column, the value of the event with the highest sequence that set it, whatever the batch
  boundaries were, so two replays of one log give identical tables.
- **Never crashes on bad input.** A message that fails the typed decoders is recorded in ``undecodable``
  (stream, seq, subject, error, raw bytes) and skipped; dead letters (``irsi.deadletter.*``, not events)
  are decoded with ``events.DeadLetter`` into ``dead_letters``.
- **Batched and set-based.** A batch (thousands of messages) is one transaction; rows are staged as numpy
  columns and inserted with one ``INSERT … SELECT`` per table; the per-trial upsert aggregates a batch
  per trial in SQL, then merges with ``ON CONFLICT``.

DuckDB allows one writing process per file: this module never opens a file for writing behind its
caller's back; the reporter service is the one writer of ``<data_dir>/analyst.duckdb`` and analysts read
``analyst.snapshot.duckdb`` (``publish_snapshot``). It must not publish to, or ack on, the bus.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import json as _stdjson
import os
import secrets
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import duckdb
import msgspec
import nats.js.errors
import numpy as np
from nats.aio.msg import Msg
from nats.js import api

from infrarsi import events as ev
from infrarsi import subjects
from infrarsi.bus import BANK_STREAM, LIFECYCLE_STREAM, TELEMETRY_STREAM, Bus
from infrarsi.logs import get_logger

log = get_logger(__name__)

REPLAYED_STREAMS: tuple[str, ...] = (LIFECYCLE_STREAM, TELEMETRY_STREAM, BANK_STREAM)
ANALYST_DB_NAME = "analyst.duckdb"
SNAPSHOT_NAME = "analyst.snapshot.duckdb"
DB_SCHEMA_VERSION = "3"
"""Bumped when a table changes; a DB of another version must be rebuilt (``infrarsi replay --from-scratch``)."""
DEFAULT_BATCH = 10_000
"""Messages per transaction: large enough that per-statement overhead vanishes, small enough to pipeline."""

StreamMessage = tuple[int, str, bytes]
"""(stream sequence, subject, data): what the projection needs of one stored message."""


def analyst_db_path(data_dir: Path | str) -> Path:
    """The reporter's writable analyst DB."""
    return Path(data_dir) / ANALYST_DB_NAME


def snapshot_path(data_dir: Path | str) -> Path:
    """The newest read-only copy the reporter publishes for analysts (``infrarsi sql`` reads it)."""
    return Path(data_dir) / SNAPSHOT_NAME


class AnalystDBError(RuntimeError):
    """The analyst DB cannot be opened (locked by another writer, not a DuckDB file, other schema)."""


# --------------------------------------------------------------------------------------------------
# Schema
# --------------------------------------------------------------------------------------------------

_STUDY_COLUMNS: dict[str, str] = {
    "cluster_id": "VARCHAR",
    "name": "VARCHAR",
    "goal": "VARCHAR",
    "contract": "JSON",
    "contract_sha256": "VARCHAR",
    "workload_dir": "VARCHAR",
    "baseline_ref": "VARCHAR",
    "accelerator": "VARCHAR",
    "cluster": "JSON",
    "bank_seeds": "JSON",
    "created_at": "TIMESTAMPTZ",
    "doctor_repeats": "INTEGER",
    "baseline_trial_ids": "JSON",
    "baseline_step_time_s": "DOUBLE",
    "run_to_run_cv": "DOUBLE",
    "step_to_step_cv": "DOUBLE",
    "warmup_steps": "INTEGER",
    "phase_fractions": "JSON",
    "stragglers": "JSON",
    "min_detectable_speedup": "DOUBLE",
    "repeats_per_trial": "INTEGER",
    "peak_flops_measured": "DOUBLE",
    "baseline_mfu": "DOUBLE",
    "doctor_completed_at": "TIMESTAMPTZ",
    "finish_reason": "VARCHAR",
    "trials": "INTEGER",
    "accelerator_s": "DOUBLE",
    "best_candidate_key": "VARCHAR",
    "best_speedup": "DOUBLE",
    "finished_at": "TIMESTAMPTZ",
}

_TRIAL_COLUMNS: dict[str, str] = {
    "cluster_id": "VARCHAR",
    # TrialProposed
    "candidate_key": "VARCHAR",
    "knobs": "JSON",
    "patches": "JSON",
    "kind": "VARCHAR",
    "origin": "VARCHAR",
    "reason": "VARCHAR",
    "repeat": "INTEGER",
    "horizon_steps": "INTEGER",
    "verify_id": "VARCHAR",
    "predicted_step_time_s": "DOUBLE",
    "prediction": "JSON",
    "proposed_at": "TIMESTAMPTZ",
    # TrialLaunched
    "backend": "VARCHAR",
    "host": "VARCHAR",
    "job_id": "VARCHAR",
    "nodes": "INTEGER",
    "ranks": "INTEGER",
    "launched_at": "TIMESTAMPTZ",
    # TrialFinished (the launcher's account) and TrialMeasured: ``status`` is the later of the two
    "status": "VARCHAR",
    "finish_status": "VARCHAR",
    "finish_reason": "VARCHAR",
    "exit_code": "INTEGER",
    "wall_s": "DOUBLE",
    "accelerator_s": "DOUBLE",
    "warmup_accelerator_s": "DOUBLE",
    "steady_accelerator_s": "DOUBLE",
    "launcher_peak_memory_bytes": "BIGINT",
    "censored_peak_bytes": "BIGINT",
    "memory_capacity_bytes": "BIGINT",
    "steps_completed": "INTEGER",
    "finished_at": "TIMESTAMPTZ",
    # TrialMeasured
    "step_time_s": "DOUBLE",
    "step_time_mad_s": "DOUBLE",
    "step_time_with_warmup_s": "DOUBLE",
    "tokens_per_s": "DOUBLE",
    "mfu": "DOUBLE",
    "flops_per_step": "DOUBLE",
    "phases": "JSON",
    "peak_memory_bytes": "BIGINT",
    "peak_memory_per_rank": "JSON",
    "per_rank_step_s": "JSON",
    "stragglers": "JSON",
    "measured_steps": "INTEGER",
    "warmup_steps": "INTEGER",
    "optimizer_steps": "BIGINT",
    "tokens": "BIGINT",
    "final_loss": "DOUBLE",
    "invariants_ok": "BOOLEAN",
    "invariants": "JSON",
    "failed_invariants": "JSON",
    "measured_accelerator_s": "DOUBLE",
    "measured_at": "TIMESTAMPTZ",
}


def _columns_ddl(columns: dict[str, str]) -> str:
    return ",\n    ".join(f'"{name}" {type_}' for name, type_ in columns.items())


SCHEMA = f"""
CREATE TABLE IF NOT EXISTS _meta (key VARCHAR PRIMARY KEY, value VARCHAR);
CREATE TABLE IF NOT EXISTS _positions (stream VARCHAR PRIMARY KEY, last_seq UBIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS lifecycle_events (
    stream VARCHAR NOT NULL, seq UBIGINT NOT NULL, subject VARCHAR, event_id VARCHAR, type VARCHAR,
    study_id VARCHAR, trial_id VARCHAR, cluster_id VARCHAR, source VARCHAR, ts TIMESTAMPTZ,
    schema_version INTEGER, payload JSON
);
CREATE TABLE IF NOT EXISTS steps (
    seq UBIGINT NOT NULL, study_id VARCHAR, trial_id VARCHAR, rank INTEGER, world_size INTEGER,
    step BIGINT, loss DOUBLE, step_time_s DOUBLE, phases JSON, tokens BIGINT, optimizer_steps BIGINT,
    loss_tokens BIGINT, peak_memory_bytes BIGINT, flops DOUBLE, mfu DOUBLE, eval_loss DOUBLE,
    eval_tokens BIGINT, wall_time DOUBLE, ts TIMESTAMPTZ,
    event_id VARCHAR, subject VARCHAR, cluster_id VARCHAR, source VARCHAR, schema_version INTEGER,
    shape JSON  -- the model's shape (WorkloadShape) on the first record of a probe, else NULL
);
CREATE OR REPLACE VIEW events AS
    SELECT * FROM lifecycle_events
    UNION ALL
    SELECT '{TELEMETRY_STREAM}' AS stream, seq, subject, event_id, 'TrialStep' AS type, study_id, trial_id,
           cluster_id, source, ts, schema_version,
           json_object('type', 'TrialStep', 'rank', rank, 'world_size', world_size, 'step', step, 'loss', loss,
                       'step_time_s', step_time_s, 'phases', phases, 'tokens', tokens,
                       'optimizer_steps', optimizer_steps, 'loss_tokens', loss_tokens,
                       'peak_memory_bytes', peak_memory_bytes, 'flops', flops, 'mfu', mfu, 'eval_loss', eval_loss,
                       'eval_tokens', eval_tokens, 'wall_time', wall_time, 'shape', shape) AS payload
    FROM steps;
CREATE TABLE IF NOT EXISTS studies (
    study_id VARCHAR PRIMARY KEY,
    {_columns_ddl(_STUDY_COLUMNS)},
    last_seq UBIGINT
);
CREATE TABLE IF NOT EXISTS trials (
    study_id VARCHAR NOT NULL, trial_id VARCHAR NOT NULL,
    {_columns_ddl(_TRIAL_COLUMNS)},
    last_seq UBIGINT,
    PRIMARY KEY (study_id, trial_id)
);
CREATE TABLE IF NOT EXISTS models (
    seq UBIGINT NOT NULL, event_id VARCHAR, study_id VARCHAR, ts TIMESTAMPTZ, n_trials INTEGER,
    n_oom INTEGER, fit_seconds DOUBLE, noise_std_log DOUBLE, best_candidate_key VARCHAR,
    best_predicted_step_s DOUBLE, time_effects JSON, memory_effects JSON, diagnostics JSON
);
CREATE TABLE IF NOT EXISTS verifications (
    seq UBIGINT NOT NULL, event_id VARCHAR, study_id VARCHAR, ts TIMESTAMPTZ, verify_id VARCHAR,
    candidate_key VARCHAR, knobs JSON, patches JSON, passes INTEGER, promotable BOOLEAN, speedup DOUBLE,
    ci_low DOUBLE, ci_high DOUBLE, baseline_step_s DOUBLE, candidate_step_s DOUBLE, mfu_before DOUBLE,
    mfu_after DOUBLE, invariants JSON, failed_invariants JSON, trial_ids JSON
);
CREATE TABLE IF NOT EXISTS bank (
    seq UBIGINT NOT NULL, event_id VARCHAR, entry_id VARCHAR, origin_study VARCHAR, cluster_id VARCHAR,
    ts TIMESTAMPTZ, accelerator VARCHAR, generation VARCHAR, device_memory_bytes BIGINT,
    interconnect VARCHAR, nodes INTEGER, devices_per_node INTEGER, model_family VARCHAR,
    model_params DOUBLE, seq_len INTEGER, global_batch INTEGER, micro_batch INTEGER, precision VARCHAR,
    meta JSON, time_effects JSON, memory_effects JSON, winners JSON, failures JSON
);
CREATE TABLE IF NOT EXISTS dead_letters (
    stream VARCHAR NOT NULL, seq UBIGINT NOT NULL, subject VARCHAR, service VARCHAR,
    original_subject VARCHAR, original_stream_seq UBIGINT, error VARCHAR, raw BLOB, ts TIMESTAMPTZ
);
CREATE TABLE IF NOT EXISTS undecodable (
    stream VARCHAR NOT NULL, seq UBIGINT NOT NULL, subject VARCHAR, error VARCHAR, raw BLOB
);
CREATE OR REPLACE VIEW failures AS
    SELECT study_id, trial_id, candidate_key, kind, origin, status, finish_status,
           coalesce(finish_reason, '') AS reason, exit_code,
           CASE WHEN status = 'invariant_violation' THEN failed_invariants END AS failed_invariants,
           censored_peak_bytes, memory_capacity_bytes, steps_completed,
           wall_s, coalesce(accelerator_s, measured_accelerator_s, 0.0) AS accelerator_s, finished_at
    FROM trials WHERE status IS NOT NULL AND status <> 'ok';
CREATE OR REPLACE VIEW agent_exchanges AS
    SELECT a.study_id, a.payload->>'ask_id' AS ask_id, a.payload->>'purpose' AS purpose,
           a.payload->>'model' AS model, a.ts AS asked_at, b.ts AS answered_at,
           CAST(b.payload->>'ok' AS BOOLEAN) AS ok, b.payload->>'error' AS error,
           CAST(b.payload->>'prompt_tokens' AS BIGINT) AS prompt_tokens,
           CAST(b.payload->>'completion_tokens' AS BIGINT) AS completion_tokens,
           CAST(b.payload->>'cost_usd' AS DOUBLE) AS cost_usd,
           json_array_length(b.payload->'candidates') AS candidates,
           json_array_length(b.payload->'patches') AS patches, json_array_length(b.payload->'priors') AS priors,
           json_array_length(b.payload->'refused') AS refused, a.payload->'messages' AS messages,
           b.payload->>'text' AS answer
    FROM lifecycle_events a
    LEFT JOIN lifecycle_events b
        ON b.type = 'AgentAnswered' AND b.study_id = a.study_id AND b.payload->>'ask_id' = a.payload->>'ask_id'
    WHERE a.type = 'AgentAsked';
"""

PROJECTION_TABLES: tuple[str, ...] = (
    "events", "lifecycle_events", "studies", "trials", "steps", "failures", "models", "verifications", "bank",
    "dead_letters", "undecodable", "_positions", "agent_exchanges",
)
"""Every table (and view) a replay fills, for comparisons of whole databases."""


# --------------------------------------------------------------------------------------------------
# Decoding
# --------------------------------------------------------------------------------------------------


class _Envelope(msgspec.Struct):
    """``events.Event`` with the payload left undecoded: envelope columns and the payload's JSON text."""

    event_id: str
    type: str
    study_id: str
    cluster_id: str
    source: str
    ts: datetime
    payload: msgspec.Raw
    trial_id: str | None = None
    schema_version: int = ev.SCHEMA_VERSION


class _NotAStep(msgspec.Struct, tag="_NotAStep"):
    """Second member of the step decoder's union: makes the payload's ``type`` tag required, as in ``Event``."""


class _StepEvent(msgspec.Struct, kw_only=True):
    """``events.Event`` whose payload can only be a ``TrialStep``: one pass over a telemetry message.

    Decoding succeeds only where ``events.decode`` would give a ``TrialStep`` payload (a payload of any other
    type fails on its tag); ``decode_batch`` also checks the envelope's ``type``, and sends anything else down
    the general path.
    """

    event_id: str
    type: str
    study_id: str
    trial_id: str | None = None
    cluster_id: str
    source: str
    ts: datetime
    schema_version: int = ev.SCHEMA_VERSION
    payload: ev.TrialStep | _NotAStep


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


_MODEL_COLUMNS = (
    "seq", "event_id", "study_id", "ts_us", "n_trials", "n_oom", "fit_seconds", "noise_std_log",
    "best_candidate_key", "best_predicted_step_s", "time_effects", "memory_effects", "diagnostics",
)
_VERIFICATION_COLUMNS = (
    "seq", "event_id", "study_id", "ts_us", "verify_id", "candidate_key", "knobs", "patches", "passes",
    "promotable", "speedup", "ci_low", "ci_high", "baseline_step_s", "candidate_step_s", "mfu_before",
    "mfu_after", "invariants", "failed_invariants", "trial_ids",
)
_BANK_COLUMNS = (
    "seq", "event_id", "entry_id", "origin_study", "cluster_id", "ts_us", "accelerator", "generation",
    "device_memory_bytes", "interconnect", "nodes", "devices_per_node", "model_family", "model_params",
    "seq_len", "global_batch", "micro_batch", "precision", "meta", "time_effects", "memory_effects",
    "winners", "failures",
)


def _ts(us: int) -> datetime:
    return _EPOCH + us * _MICROSECOND


_gc_lock = threading.Lock()
_gc_pauses = 0


@contextlib.contextmanager
def _gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a batch is decoded.

    Decoding allocates ~10 objects per message (structs, dicts, strings) and frees them all once the batch
    is written; none forms a cycle, so reference counting frees them anyway. With the collector on, every
    700 allocations start a collection, and the older generations are traversed again and again: decoding
    90 000 step messages took 0.34–0.43 s of CPU with it on, 0.20 s with it paused. Nested and concurrent
    pauses (threads) are counted; the collector resumes (if it was on) when the last one ends.
    """
    global _gc_pauses
    with _gc_lock:
        _gc_pauses += 1
        if _gc_pauses == 1:
            _gc_paused.was_enabled = gc.isenabled()  # type: ignore[attr-defined]
            gc.disable()
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_paused.was_enabled:  # type: ignore[attr-defined]
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


# --------------------------------------------------------------------------------------------------
# The database
# --------------------------------------------------------------------------------------------------


def _upsert_sql(table: str, keys: tuple[str, ...], columns: dict[str, str]) -> str:
    """Merge a staged batch into ``table``: per key and column, the value of the highest ``seq`` that set it."""
    key_list = ", ".join(keys)
    aggregated = ",\n".join(
        f'(arg_max("{c}", seq) FILTER (WHERE "{c}" IS NOT NULL))::{t} AS "{c}"' for c, t in columns.items()
    )
    updates = ",\n".join(f'"{c}" = coalesce(excluded."{c}", {table}."{c}")' for c in columns)
    names = ", ".join(f'"{c}"' for c in columns)
    return f"""
        INSERT INTO {table} ({key_list}, {names}, last_seq)
        SELECT {key_list}, {aggregated}, max(seq) FROM _stage_{table} WHERE seq > $after GROUP BY {key_list}
        ON CONFLICT ({key_list}) DO UPDATE SET {updates},
            last_seq = greatest(excluded.last_seq, {table}.last_seq)
    """


_STEP_JSON_STRUCTURE = _stdjson.dumps({
    "event_id": "VARCHAR", "study_id": "VARCHAR", "trial_id": "VARCHAR", "cluster_id": "VARCHAR", "source": "VARCHAR",
    "schema_version": "INTEGER",
    "payload": {
        "rank": "INTEGER", "world_size": "INTEGER", "step": "BIGINT", "loss": "DOUBLE", "step_time_s": "DOUBLE",
        "phases": "JSON", "tokens": "BIGINT", "optimizer_steps": "BIGINT", "loss_tokens": "BIGINT",
        "peak_memory_bytes": "BIGINT", "flops": "DOUBLE", "mfu": "DOUBLE", "eval_loss": "DOUBLE",
        "eval_tokens": "BIGINT", "wall_time": "DOUBLE", "shape": "JSON",
    },
}, separators=(",", ":"))
"""How DuckDB reads a telemetry ``TrialStep`` message's columns. The message was validated by msgspec with
the catalog's types first (``_decode_into``), so this projection cannot meet a value of another type; its
``ts`` comes from the validated decode (``ts_us``), as RFC 3339 has forms DuckDB's cast reads differently."""

_INSERTS: dict[str, str] = {
    "lifecycle_events": """
        INSERT INTO lifecycle_events SELECT $stream, seq, subject, event_id, type, study_id, trial_id, cluster_id,
               source, make_timestamptz(ts_us), schema_version, payload
        FROM _stage_lifecycle_events WHERE seq > $after""",
    "steps": f"""
        INSERT INTO steps SELECT seq, m.study_id, m.trial_id, p.rank, p.world_size, p.step, p.loss, p.step_time_s,
               coalesce(p.phases, '{{}}'), p.tokens, p.optimizer_steps, p.loss_tokens, p.peak_memory_bytes, p.flops, p.mfu,
               p.eval_loss, p.eval_tokens, coalesce(p.wall_time, 0.0), make_timestamptz(ts_us), m.event_id,
               subject, m.cluster_id, m.source, coalesce(m.schema_version, {ev.SCHEMA_VERSION}), p.shape
        FROM (SELECT seq, subject, ts_us, json_transform(json, '{_STEP_JSON_STRUCTURE}') AS m
              FROM _stage_steps WHERE seq > $after), LATERAL (SELECT m.payload AS p)""",
    "studies": _upsert_sql("studies", ("study_id",), _STUDY_COLUMNS),
    "trials": _upsert_sql("trials", ("study_id", "trial_id"), _TRIAL_COLUMNS),
    "models": f"""
        INSERT INTO models SELECT {", ".join(c if c != "ts_us" else "make_timestamptz(ts_us)" for c in _MODEL_COLUMNS)}
        FROM _stage_models WHERE seq > $after""",
    "verifications": f"""
        INSERT INTO verifications
        SELECT {", ".join(c if c != "ts_us" else "make_timestamptz(ts_us)" for c in _VERIFICATION_COLUMNS)}
        FROM _stage_verifications WHERE seq > $after""",
    "bank": f"""
        INSERT INTO bank SELECT {", ".join(c if c != "ts_us" else "make_timestamptz(ts_us)" for c in _BANK_COLUMNS)}
        FROM _stage_bank WHERE seq > $after""",
    "dead_letters": """
        INSERT INTO dead_letters SELECT $stream, seq, subject, service, original_subject, original_stream_seq,
               error, raw, make_timestamptz(ts_us)
        FROM _stage_dead_letters WHERE seq > $after""",
    "undecodable": """
        INSERT INTO undecodable SELECT $stream, seq, subject, error, raw FROM _stage_undecodable WHERE seq > $after""",
}


class AnalystDB:
    """One open analyst DuckDB file: writable (one process at a time) or read-only.

    Calling order: ``open`` → ``apply_batch``/``write_batch`` (from one thread at a time) and ``query`` → ``close``.
    """

    def __init__(self, con: duckdb.DuckDBPyConnection, path: Path, read_only: bool) -> None:
        self.con = con
        self.path = path
        self.read_only = read_only
        self._positions: dict[str, int] = {}

    @classmethod
    def open(cls, path: Path | str, *, read_only: bool = False) -> AnalystDB:
        """Open (creating the file and schema when writable); ``AnalystDBError`` with DuckDB's reason if not."""
        path = Path(path)
        if read_only and not path.exists():
            raise AnalystDBError(f"cannot open analyst DB {path}: no such file")
        if not read_only:
            path.parent.mkdir(parents=True, exist_ok=True)
        try:
            con = duckdb.connect(str(path), read_only=read_only)
        except duckdb.Error as exc:
            raise AnalystDBError(f"cannot open analyst DB {path}: {exc}") from None
        db = cls(con, path, read_only)
        try:
            con.execute("SET TimeZone = 'UTC'")
            if not read_only:
                # Fewer automatic checkpoints mid-replay (each rewrites the open row groups); the WAL is
                # folded in by ``checkpoint``/``publish_snapshot`` and at close.
                con.execute("SET checkpoint_threshold = '256MB'")
                db._create_schema()
            db._load_positions()
        except duckdb.Error as exc:
            con.close()
            raise AnalystDBError(f"cannot use analyst DB {path}: {exc}") from None
        return db

    def _create_schema(self) -> None:
        self.con.execute(SCHEMA)
        rows = self.con.execute("SELECT value FROM _meta WHERE key = 'schema_version'").fetchall()
        row = rows[0] if rows else None
        if row is None:
            self.con.execute("INSERT INTO _meta VALUES ('schema_version', ?)", [DB_SCHEMA_VERSION])
        elif row[0] != DB_SCHEMA_VERSION:
            raise AnalystDBError(
                f"{self.path} has analyst schema {row[0]}, this build writes {DB_SCHEMA_VERSION}: "
                "rebuild it with `infrarsi replay --from-scratch`"
            )

    def _load_positions(self) -> None:
        with contextlib.suppress(duckdb.CatalogException):
            self._positions = dict(self.con.execute("SELECT stream, last_seq FROM _positions").fetchall())

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> AnalystDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---------------------------------------------------------------- reading

    def position(self, stream: str) -> int:
        """The last stream sequence applied (0: none)."""
        return self._positions.get(stream, 0)

    def positions(self) -> dict[str, int]:
        return {s: self.position(s) for s in REPLAYED_STREAMS}

    def refresh_positions(self) -> dict[str, int]:
        """Re-read positions from the file (a read-only handle on a file another connection writes)."""
        self._load_positions()
        return self.positions()

    def query(self, sql: str, params: Sequence[Any] | dict[str, Any] | None = None) -> tuple[list[str], list[tuple]]:
        """Run one statement; returns (column names, rows). DuckDB errors propagate as ``duckdb.Error``."""
        cursor = self.con.execute(sql, params) if params is not None else self.con.execute(sql)
        columns = [d[0] for d in cursor.description] if cursor.description else []
        return columns, cursor.fetchall() if cursor.description else []

    # ---------------------------------------------------------------- writing

    def apply_batch(self, stream: str, msgs: Sequence[StreamMessage] | Sequence[Msg]) -> int:
        """Decode and apply messages of ``stream`` (in order); returns how many were new. Idempotent."""
        if msgs and isinstance(msgs[0], Msg):
            msgs = stream_messages(msgs)  # type: ignore[arg-type]
        return self.write_batch(decode_batch(stream, msgs, after_seq=self.position(stream)))  # type: ignore[arg-type]

    def write_batch(self, batch: Batch) -> int:
        """Apply a decoded batch in one transaction with its position; returns the messages it advanced by."""
        if not batch.last_seq:
            return 0
        con = self.con
        con.execute("BEGIN TRANSACTION")
        try:
            rows = con.execute("SELECT last_seq FROM _positions WHERE stream = ?", [batch.stream]).fetchall()
            after = rows[0][0] if rows else 0
            if batch.last_seq <= after:
                con.execute("ROLLBACK")
                self._positions[batch.stream] = after
                return 0
            params = {"after": after, "stream": batch.stream}
            for table, arrays in batch.tables.items():
                self._insert(con, table, arrays, params)
            con.execute(
                "INSERT INTO _positions VALUES (?, ?) ON CONFLICT (stream) DO UPDATE SET last_seq = excluded.last_seq",
                [batch.stream, batch.last_seq],
            )
            con.execute("COMMIT")
        except BaseException:
            with contextlib.suppress(duckdb.Error):
                con.execute("ROLLBACK")
            raise
        advanced = batch.last_seq - max(after, batch.first_seq - 1)
        self._positions[batch.stream] = batch.last_seq
        return advanced

    @staticmethod
    def _insert(con: duckdb.DuckDBPyConnection, table: str, arrays: dict[str, np.ndarray], params: dict) -> None:
        stage = f"_stage_{table}"
        sql = _INSERTS[table]
        con.register(stage, arrays)
        try:
            con.execute(sql, {k: v for k, v in params.items() if f"${k}" in sql})
        finally:
            con.unregister(stage)

    def checkpoint(self) -> None:
        self.con.execute("CHECKPOINT")

    def publish_snapshot(self, dest: Path | str) -> Path:
        """Write a consistent read-only copy to ``dest``: copy into a temp file, rename it over ``dest``.

        Readers holding the previous snapshot keep reading it (a rename never changes an open file);
        new readers see the new one. Call it from the thread that writes, between batches.
        """
        dest = Path(dest)
        tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
        for stale in (tmp, tmp.with_name(tmp.name + ".wal")):
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()
        # A logical copy through DuckDB, not a file copy: opening and closing the DB file from this
        # process would drop DuckDB's fcntl lock on it (POSIX releases a process's locks on any close),
        # and a second writer could then open it.
        [(catalog,)] = self.con.execute("SELECT current_database()").fetchall()
        self.con.execute(f"ATTACH '{tmp}' AS _snapshot")
        try:
            self.con.execute(f'COPY FROM DATABASE "{catalog}" TO _snapshot')
        finally:
            self.con.execute("DETACH _snapshot")
        try:
            os.replace(tmp, dest)
        finally:
            for leftover in (tmp, tmp.with_name(tmp.name + ".wal")):
                with contextlib.suppress(FileNotFoundError):
                    leftover.unlink()
        return dest


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


# --------------------------------------------------------------------------------------------------
# Reading the streams
# --------------------------------------------------------------------------------------------------


def _sequences(reply: str) -> tuple[int, int]:
    """(stream seq, consumer seq) from a JetStream delivery's reply subject (v1 and v2 ack formats)."""
    tokens = reply.split(".")
    if len(tokens) == 9:  # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>
        return int(tokens[5]), int(tokens[6])
    # $JS.ACK.<domain>.<account>.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>[.<token>]
    return int(tokens[7]), int(tokens[8])


def stream_messages(msgs: Sequence[Msg]) -> list[StreamMessage]:
    """``(seq, subject, data)`` of messages fetched through nats-py (e.g. ``Bus.iter_stream``)."""
    return [(_sequences(m.reply)[0], m.subject, m.data) for m in msgs]


class StreamReadError(RuntimeError):
    """The ordered read stalled; the caller resumes from its stored position."""


_READ_CHUNK = 1 << 20
_PUSH_PENDING_BYTES = 16 << 20


class _RawUnavailable(Exception):
    """This connection cannot be mirrored by ``_RawReader``; use nats-py's ordered consumer."""


class _RawReader:
    """A second, minimal NATS connection that receives one ephemeral push consumer's deliveries in bulk.

    nats-py spends most of a replay's time per message (its parser trims its buffer after every message,
    builds a ``Msg`` and a header dict, and hands each to a queue and a task); this reads the socket in
    1 MiB chunks and cuts messages out of them with ``bytes.find``. The consumer is created through the
    bus (JetStream API), ack policy none, flow control and heartbeats on, delivering to an inbox only this
    connection subscribes to; flow-control requests are answered as they are parsed, so the server never
    runs more than its flow-control window ahead of the reader (backpressure). Only plain TCP with no auth,
    a user and password, or a token; anything else raises ``_RawUnavailable``.
    """

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer
        self._buf = b""
        self._pos = 0
        self.inbox = f"_INBOX.irsi_replay_{secrets.token_hex(8)}"
        self.next_cseq = 1

    @classmethod
    async def connect(cls, bus: Any, timeout_s: float = 5.0) -> _RawReader:
        nc = bus.nc
        uri = nc.connected_url
        options = getattr(nc, "options", {})
        if (
            uri is None
            or uri.scheme not in ("nats", "")
            or options.get("tls") is not None
            or any(getattr(nc, a, None) for a in ("_user_credentials", "_nkeys_seed", "_nkeys_seed_str",
                                                  "_signature_cb", "_user_jwt_cb"))
        ):
            raise _RawUnavailable("not a plain TCP connection")
        try:
            reader, writer = await asyncio.wait_for(
                asyncio.open_connection(uri.hostname, uri.port or 4222, limit=_READ_CHUNK), timeout_s
            )
        except (OSError, TimeoutError) as exc:
            raise _RawUnavailable(f"cannot connect: {exc}") from None
        self = cls(reader, writer)
        try:
            line = await asyncio.wait_for(reader.readline(), timeout_s)
            if not line.startswith(b"INFO "):
                raise _RawUnavailable(f"unexpected greeting {line[:40]!r}")
            info = _stdjson.loads(line[5:])
            if info.get("tls_required") or not info.get("headers"):
                raise _RawUnavailable("server requires TLS or lacks headers")
            connect: dict[str, Any] = {"verbose": False, "pedantic": False, "headers": True, "no_responders": True,
                                       "protocol": 1, "lang": "python-infrarsi", "version": "1",
                                       "name": f"{options.get('name') or 'infrarsi'}-replay-reader"}
            user = uri.username or options.get("user")
            password = uri.password or options.get("password")
            token = options.get("token")
            if user and password is None and not token:
                token, user = user, None  # nats://TOKEN@host
            if user:
                connect.update(user=user, **{"pass": password or ""})
            elif token:
                connect["auth_token"] = token
            elif info.get("nonce"):
                raise _RawUnavailable("server wants a signed nonce")
            writer.write(b"CONNECT %s\r\nSUB %s 1\r\nPING\r\n" % (_stdjson.dumps(connect).encode(), self.inbox.encode()))
            while True:
                line = await asyncio.wait_for(reader.readline(), timeout_s)
                if line.startswith(b"PONG"):
                    break
                if line.startswith(b"-ERR") or not line:
                    raise _RawUnavailable(f"server refused the connection: {line.strip()!r}")
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._writer.close()

    async def receive(self, timeout_s: float) -> list[StreamMessage]:
        """The deliveries parsed from what has arrived (waiting up to ``timeout_s`` for at least one)."""
        out: list[StreamMessage] = []
        append = out.append
        write = self._writer.write
        buf, pos = self._buf, self._pos
        cseq = self.next_cseq
        while True:
            n = len(buf)
            while True:
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    break
                c = buf[pos]
                if c == 72 or c == 77:  # HMSG subject sid [reply] hdr_len total_len / MSG subject sid [reply] len
                    parts = buf[pos:eol].split(b" ")
                    hmsg = c == 72
                    start = eol + 2
                    hdr_end = start + int(parts[-2]) if hmsg else start
                    end = start + int(parts[-1])
                    if end + 2 > n:
                        break
                    pos = end + 2
                    reply = parts[3] if len(parts) == (6 if hmsg else 5) else b""
                    if hmsg and buf[start + 8] == 32:  # "NATS/1.0 100 …": flow control or heartbeat
                        if reply:
                            write(b"PUB %s 0\r\n\r\n" % reply)
                        else:
                            i = buf.find(b"Nats-Consumer-Stalled: ", start, hdr_end)
                            if i >= 0:
                                write(b"PUB %s 0\r\n\r\n" % buf[i + 23:buf.find(b"\r", i)].strip())
                        continue
                    tokens = reply.split(b".")
                    if len(tokens) == 9:  # $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>
                        sseq, dseq = int(tokens[5]), int(tokens[6])
                    elif len(tokens) >= 11:  # $JS.ACK.<domain>.<account>.<stream>.<consumer>.<d>.<sseq>.<cseq>…
                        sseq, dseq = int(tokens[7]), int(tokens[8])
                    else:
                        raise StreamReadError(f"unexpected delivery {buf[pos:eol][:200]!r}")
                    if dseq != cseq:
                        raise StreamReadError(f"delivery {dseq} after {cseq - 1}: a message was lost")
                    cseq += 1
                    append((sseq, parts[1].decode(), buf[hdr_end:end]))
                elif buf.startswith(b"PING", pos):
                    write(b"PONG\r\n")
                    pos = eol + 2
                elif buf.startswith(b"-ERR", pos):
                    raise StreamReadError(f"server error: {buf[pos:eol]!r}")
                else:  # +OK, PONG, INFO
                    pos = eol + 2
            self._buf, self._pos, self.next_cseq = buf, pos, cseq
            if out:
                return out
            try:
                data = await asyncio.wait_for(self._reader.read(_READ_CHUNK), timeout_s)
            except TimeoutError:
                raise TimeoutError from None
            if not data:
                raise StreamReadError("connection closed")
            buf, pos = buf[pos:] + data, 0


async def read_stream(
    bus: Bus, stream: str, start_seq: int = 1, *, idle_timeout_s: float = 10.0, direct: bool | None = None
) -> AsyncIterator[list[StreamMessage]]:
    """Every message of ``stream`` from ``start_seq`` up to its last sequence when the read began, in order.

    An ephemeral push consumer read by ``_RawReader`` where the connection allows it, else nats-py's
    ordered push consumer (``_read_stream_ordered``); ``direct`` forces one or the other. Ephemeral, no
    acks: nothing is left on the server.
    """
    try:
        info = await bus.js.stream_info(stream)
    except nats.js.errors.NotFoundError:
        return  # a stream nobody created yet is an empty one
    last = info.state.last_seq
    start_seq = max(start_seq, info.state.first_seq or 1)
    if info.state.messages == 0 or last < start_seq:
        return
    reader: _RawReader | None = None
    if direct is not False:
        try:
            reader = await _RawReader.connect(bus)
        except _RawUnavailable as exc:
            if direct:
                raise StreamReadError(f"{stream}: cannot read with a raw connection: {exc}") from None
            log.debug("raw reader unavailable; reading with nats-py's ordered consumer", reason=str(exc))
    if reader is None:
        async for chunk in _read_stream_ordered(bus, stream, start_seq, idle_timeout_s=idle_timeout_s):
            yield chunk
        return
    consumer: str | None = None
    try:
        created = await bus.js.add_consumer(stream, api.ConsumerConfig(
            deliver_subject=reader.inbox, deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=start_seq, ack_policy=api.AckPolicy.NONE, max_deliver=1, flow_control=True,
            idle_heartbeat=5.0, mem_storage=True, num_replicas=1, inactive_threshold=30.0,
        ))
        consumer = created.name
        seen = start_seq - 1
        while seen < last:
            try:
                msgs = await reader.receive(idle_timeout_s)
            except TimeoutError:
                now = await bus.js.stream_info(stream)
                if now.state.messages == 0 or now.state.last_seq <= seen:
                    return  # the tail was deleted (retention, purge) while we read
                raise StreamReadError(f"{stream}: nothing delivered for {idle_timeout_s:.0f}s after seq {seen}") from None
            seen = msgs[-1][0]
            upto = _upto(msgs, last)
            if upto:
                yield msgs if upto == len(msgs) else msgs[:upto]
    finally:
        reader.close()
        if consumer is not None:
            with contextlib.suppress(Exception):
                await bus.js.delete_consumer(stream, consumer)


async def _read_stream_ordered(
    bus: Bus, stream: str, start_seq: int = 1, *, max_buffer: int = 32_768, idle_timeout_s: float = 10.0
) -> AsyncIterator[list[StreamMessage]]:
    """``read_stream`` through nats-py's ordered push consumer (the fallback).

    Like ``Bus.iter_stream`` (ephemeral, no acks, nothing left on the server) but several times faster:
    nats-py's pull ``fetch`` waits for each message in a task of its own, while its ordered push consumer
    hands messages to one callback, with flow control and gap recovery (it re-creates the consumer after
    a lost message) done by nats-py. Backpressure: when ``max_buffer`` messages wait to be taken, the
    callback waits too, nats-py withholds the flow-control reply, and the server pauses.
    """
    try:
        info = await bus.js.stream_info(stream)
    except nats.js.errors.NotFoundError:
        return  # a stream nobody created yet is an empty one
    last = info.state.last_seq
    start_seq = max(start_seq, info.state.first_seq or 1)
    if info.state.messages == 0 or last < start_seq:
        return
    buffer: list[StreamMessage] = []
    ready = asyncio.Event()
    room = asyncio.Event()
    room.set()

    async def on_message(msg: Msg) -> None:
        if len(buffer) >= max_buffer:
            room.clear()
            await room.wait()
        seq = _sequences(msg.reply)[0]
        buffer.append((seq, msg.subject, msg.data))
        if len(buffer) >= 1024 or seq >= last:
            ready.set()

    sub = await bus.js.subscribe(
        "",
        stream=stream,
        cb=on_message,
        ordered_consumer=True,
        deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE,
        config=api.ConsumerConfig(opt_start_seq=start_seq),
        pending_msgs_limit=-1,
        pending_bytes_limit=-1,
    )
    try:
        seen = start_seq - 1
        while seen < last:
            try:
                await asyncio.wait_for(ready.wait(), 0.05 if buffer else idle_timeout_s)
            except TimeoutError:
                if not buffer:
                    now = await bus.js.stream_info(stream)
                    if now.state.messages == 0 or now.state.last_seq <= seen:
                        return  # the tail was deleted (retention, purge) while we read
                    raise StreamReadError(
                        f"{stream}: nothing delivered for {idle_timeout_s:.0f}s after seq {seen}"
                    ) from None
            ready.clear()
            if buffer:
                chunk = buffer[:]
                buffer.clear()
                room.set()
                seen = chunk[-1][0]
                yield chunk[: _upto(chunk, last)]
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


def _upto(chunk: list[StreamMessage], last: int) -> int:
    """How many messages of ``chunk`` have sequence ``<= last`` (the read stops where the stream ended)."""
    if chunk[-1][0] <= last:
        return len(chunk)
    return next(i for i, m in enumerate(chunk) if m[0] > last)


# --------------------------------------------------------------------------------------------------
# Replay
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplayStats:
    events: int
    """Messages applied (events, dead letters and undecodable ones) in this run."""
    seconds: float
    events_per_s: float


Progress = Callable[[int, int], None]
"""Called with (messages applied so far, messages to apply in this run)."""


async def backlog(bus: Bus, db: AnalystDB) -> dict[str, int]:
    """Messages per stream past the DB's position (what a catch-up will read)."""
    counts = await bus.stream_counts()
    return {
        stream: max(0, counts[stream]["last_seq"] - db.position(stream))
        for stream in REPLAYED_STREAMS
        if stream in counts and counts[stream]["messages"]
    }


async def catch_up(
    bus: Bus,
    db: AnalystDB,
    *,
    progress: Progress | None = None,
    batch_size: int = DEFAULT_BATCH,
    executor: concurrent.futures.Executor | None = None,
) -> int:
    """Apply every message past the DB's positions, stream by stream; returns how many were applied.

    Three stages overlap: a reader task drains the stream into batches (so the server's flow control is
    answered while the rest works), the event loop decodes a batch (in slices, giving the reader turns),
    and ``executor`` (one thread: DuckDB releases the GIL while it inserts) writes the previous one.

    Throughput is the same as a plain ``async for`` over ``read_stream`` that decodes and writes in turn; what
    the split buys is a clean cancellation (a stopping reporter cancels its catch-up): the reader task is
    cancelled and awaited and the pending write awaited, each in its own ``finally``. With the plain loop a
    stopping reporter hung past 60 s in 3 of 8 runs of
    ``tests/integration/test_bank_wiring.py::test_a_finished_study_seeds_the_next_init_through_the_reporter``
    (0 of 10 with this one).
    """
    todo = await backlog(bus, db)
    total = sum(todo.values())
    if total == 0:
        return 0
    own_executor = executor is None
    pool = executor or concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="analyst-db")
    applied = _Applied(total, progress)
    try:
        for stream in todo:
            for attempt in range(3):
                try:
                    await _catch_up_stream(bus, db, stream, pool, batch_size, applied)
                    break
                except StreamReadError as exc:
                    if attempt == 2:
                        raise
                    log.warning("stream read interrupted; resuming from the stored position", error=str(exc))
    finally:
        if own_executor:
            pool.shutdown(wait=True)
    return applied.count


@dataclass
class _Applied:
    """Messages applied so far in one catch-up (kept across a resumed stream read), reported to ``progress``."""

    total: int
    progress: Progress | None
    count: int = 0

    def add(self, n: int) -> None:
        self.count += n
        if self.progress:
            self.progress(self.count, self.total)


_READ_AHEAD_BATCHES = 2
"""Batches the reader may hold while the previous ones decode and write (then it stops reading, and the
server waits on flow control: memory stays bounded)."""


async def _catch_up_stream(
    bus: Bus, db: AnalystDB, stream: str, pool: concurrent.futures.Executor, batch_size: int, applied: _Applied
) -> None:
    """One stream from the DB's position to its end (``catch_up``'s pipeline). Every batch handed to the
    writer is awaited (and counted) before returning or raising."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[list[StreamMessage] | BaseException | None] = asyncio.Queue(_READ_AHEAD_BATCHES)
    decoded_to = db.position(stream)

    async def read() -> None:
        buffer: list[StreamMessage] = []
        try:
            async for chunk in read_stream(bus, stream, decoded_to + 1):
                buffer.extend(chunk)
                if len(buffer) >= batch_size:
                    await queue.put(buffer)
                    buffer = []
            if buffer:
                await queue.put(buffer)
            await queue.put(None)
        except Exception as exc:  # handed to the consumer, which raises it after its pending write
            await queue.put(exc)

    reader = asyncio.create_task(read())
    pending: asyncio.Future | None = None
    try:
        while True:
            item = await queue.get()
            if isinstance(item, BaseException):
                raise item
            if item is None:
                break
            batch = await decode_batch_yielding(stream, item, after_seq=decoded_to)
            decoded_to = batch.last_seq or decoded_to
            if pending is not None:
                applied.add(await pending)
                pending = None
            pending = loop.run_in_executor(pool, db.write_batch, batch)
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await reader
        if pending is not None:
            applied.add(await pending)


async def replay(
    bus: Bus,
    db_path: Path | str,
    *,
    from_scratch: bool = False,
    progress: Progress | None = None,
    batch_size: int = DEFAULT_BATCH,
) -> ReplayStats:
    """Bring the analyst DB at ``db_path`` up to the end of the streams (``from_scratch``: delete it first).

    Incremental by default: only messages past the stored positions are read. ``from_scratch`` removes the
    file in place; for a rebuild that never leaves a half-written DB behind, replay into a temporary
    file and rename it (what ``infrarsi replay --from-scratch`` does).
    """
    path = Path(db_path)
    if from_scratch:
        for stale in (path, path.with_name(path.name + ".wal")):
            with contextlib.suppress(FileNotFoundError):
                stale.unlink()
    started = time.perf_counter()
    db = await asyncio.to_thread(AnalystDB.open, path)
    try:
        applied = await catch_up(bus, db, progress=progress, batch_size=batch_size)
        await asyncio.to_thread(db.checkpoint)
    finally:
        db.close()
    seconds = time.perf_counter() - started
    return ReplayStats(events=applied, seconds=seconds, events_per_s=applied / seconds if seconds > 0 else 0.0)


async def wait_until(
    db: AnalystDB | Path | str, stream: str, seq: int, timeout: float = 10.0, interval: float = 0.05
) -> dict[str, int]:
    """Wait until the DB (an open one, or a file — a snapshot — reopened read-only each time) has applied
    ``stream`` up to ``seq``; returns the positions. ``TimeoutError`` says where it stood."""
    deadline = time.monotonic() + timeout
    positions: dict[str, int] = {}
    while True:
        if isinstance(db, AnalystDB):
            positions = db.positions()
        else:
            with contextlib.suppress(AnalystDBError, duckdb.Error):
                snapshot = AnalystDB.open(db, read_only=True)
                try:
                    positions = snapshot.positions()
                finally:
                    snapshot.close()
        if positions.get(stream, 0) >= seq:
            return positions
        if time.monotonic() > deadline:
            raise TimeoutError(f"analyst DB {getattr(db, 'path', db)} at {positions}, not at {stream}:{seq} after {timeout}s")
        await asyncio.sleep(interval)
