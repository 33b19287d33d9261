"""The analyst database's schema: its tables' columns and DDL (``SCHEMA``, ``PROJECTION_TABLES``), its version,
the streams it projects and its file names. Must not open a database or read a stream."""
from __future__ import annotations

from pathlib import Path

from infrarsi.bus.client import BANK_STREAM, LIFECYCLE_STREAM, TELEMETRY_STREAM

REPLAYED_STREAMS: tuple[str, ...] = (LIFECYCLE_STREAM, TELEMETRY_STREAM, BANK_STREAM)
ANALYST_DB_NAME = "analyst.duckdb"
SNAPSHOT_NAME = "analyst.snapshot.duckdb"
DB_SCHEMA_VERSION = "4"
"""Bumped when a table changes; a DB of another version must be rebuilt (``infrarsi replay --from-scratch``)."""
DEFAULT_BATCH = 10_000
"""Messages per transaction: large enough that per-statement overhead vanishes, small enough to pipeline."""



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


EVENT_COLUMNS: dict[str, str] = {
    "stream": "VARCHAR NOT NULL",
    "seq": "UBIGINT NOT NULL",
    "subject": "VARCHAR",
    "event_id": "VARCHAR",
    "type": "VARCHAR",
    "study_id": "VARCHAR",
    "trial_id": "VARCHAR",
    "cluster_id": "VARCHAR",
    "source": "VARCHAR",
    "ts": "TIMESTAMPTZ",
    "schema_version": "INTEGER",
    "payload": "JSON",
}
"""The columns of ``lifecycle_events`` and of the ``events`` view (every event, telemetry steps too): one row per
event at its stream position (``stream``, ``seq``), the envelope, and the payload as JSON. What readers of
whole events rely on (``report.source``); the view's telemetry half restates them in this order."""


def _columns_ddl(columns: dict[str, str]) -> str:
    return ",\n    ".join(f'"{name}" {type_}' for name, type_ in columns.items())


SCHEMA = f"""
CREATE TABLE IF NOT EXISTS _meta (key VARCHAR PRIMARY KEY, value VARCHAR);
CREATE TABLE IF NOT EXISTS _positions (stream VARCHAR PRIMARY KEY, last_seq UBIGINT NOT NULL);
CREATE TABLE IF NOT EXISTS lifecycle_events (
    {_columns_ddl(EVENT_COLUMNS)}
);
CREATE TABLE IF NOT EXISTS steps (
    seq UBIGINT NOT NULL, study_id VARCHAR, trial_id VARCHAR, rank INTEGER, world_size INTEGER,
    step BIGINT, loss DOUBLE, step_time_s DOUBLE, phases JSON, tokens BIGINT, optimizer_steps BIGINT,
    loss_tokens BIGINT, peak_memory_bytes BIGINT, flops DOUBLE, mfu DOUBLE, eval_loss DOUBLE,
    eval_tokens BIGINT, wall_time DOUBLE, ts TIMESTAMPTZ,
    event_id VARCHAR, subject VARCHAR, cluster_id VARCHAR, source VARCHAR, schema_version INTEGER,
    shape JSON,  -- the model's shape (WorkloadShape) on the first record of a probe, else NULL
    deterministic BOOLEAN  -- torch's deterministic algorithms on at this step (NULL: the probe did not say)
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
                       'eval_tokens', eval_tokens, 'wall_time', wall_time, 'shape', shape,
                       'deterministic', deterministic) AS payload
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
