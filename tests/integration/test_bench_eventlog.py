"""bench/eventlog.py end to end on a small log: it runs, replays every event, and its JSON carries the figures
the README quotes (replay vs raw consume, and the per-stage costs without NATS)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "eventlog.py"


def test_eventlog_bench_reports_replay_raw_and_stage_costs(tmp_path: Path) -> None:
    out = tmp_path / "eventlog.json"
    run = subprocess.run([sys.executable, str(BENCH), "--events", "3000", "--repeat", "1", "--json", str(out)],
                         capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["events"] == 3000
    assert result["replay_rounds"][0]["events"] == 3000
    for key in ("raw_consume_events_per_s", "replay_events_per_s", "replay_reader_events_per_s"):
        assert result[key] > 0, key
    assert result["replay_over_raw"] == round(result["replay_events_per_s"] / result["raw_consume_events_per_s"], 3)
    stages = result["stages_without_nats"]
    assert stages["events"] == 3000
    assert all(stages[k] > 0 for k in ("decode_s", "write_s", "checkpoint_s", "duckdb_floor_s"))
    assert stages["duckdb_floor_events_per_s"] == round(3000 / stages["duckdb_floor_s"], 1)
    assert "replay" in run.stdout and "raw=" in run.stdout
