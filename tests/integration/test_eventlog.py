"""The analyst DB against a real nats-server: deterministic, incremental, idempotent replays; bad input kept.

Each test gets a fresh server (``fresh_nats_server``) so that stream contents, and so row counts, are exact.
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import pytest
from infrarsi import eventlog
from infrarsi import events as ev
from infrarsi.bus import reader as stream_reader
from infrarsi.bus import subjects
from infrarsi.bus.client import BANK_STREAM, LIFECYCLE_STREAM, TELEMETRY_STREAM, Bus
from infrarsi.commands import UserError
from infrarsi.commands import sql as sql_command

pytestmark = pytest.mark.integration

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)


def _event(payload, n: int, study: str, trial: str | None = None) -> ev.Event:
    """Fixed ids and times: the log, and so the tables, are the same on every run."""
    return ev.Event(
        event_id=f"{study}-{trial or 'x'}-{type(payload).__name__}-{n}", type=type(payload).__name__,
        study_id=study, trial_id=trial, cluster_id="test", ts=T0 + timedelta(seconds=n),
        source=subjects.route(type(payload).__name__).publishers[0],  # services refuse other sources
        payload=payload,
    )


def study_log(study: str, payload_samples: dict, trials: int = 3, steps: int = 5, ranks: int = 2) -> list[ev.Event]:
    """A study: every payload type once (``payload_samples``), then trials with steps and outcomes."""
    out = [_event(payload_samples[name], i, study, f"{study}-t0" if "Trial" in name else None)
           for i, name in enumerate(ev.EVENT_TYPES)]
    n = len(out)
    for t in range(trials):
        trial = f"{study}-t{t + 1}"
        candidate = ev.Candidate(knobs={"micro_batch": 2 ** t}, patches=["fused-qkv"] if t else [])
        out.append(_event(ev.TrialProposed(candidate=candidate, candidate_key=candidate.key(), kind="search",
                                           origin="ei"), n := n + 1, study, trial))
        out.append(_event(ev.TrialLaunched(backend="local", workdir="/w", command=["python"], nodes=1, ranks=ranks,
                                           host="h", job_id=str(t)), n := n + 1, study, trial))
        for step in range(1, steps + 1):
            for rank in range(ranks):
                out.append(_event(ev.TrialStep(
                    rank=rank, world_size=ranks, step=step, loss=10.0 / step, step_time_s=0.5 + 0.01 * t,
                    phases={"forward": 0.2, "backward": 0.3}, tokens=4096, optimizer_steps=step,
                    peak_memory_bytes=2**30 + rank, eval_loss=9.0 if step == steps else None),
                    n := n + 1, study, trial))
        status = "oom" if t == 2 else "ok"
        out.append(_event(ev.TrialFinished(status=status, reason="out of memory" if t == 2 else "",
                                           accelerator_s=10.0 * (t + 1), steps_completed=steps),
                          n := n + 1, study, trial))
    return out


async def publish(bus: Bus, events: list[ev.Event]) -> None:
    for i in range(0, len(events), 200):
        await bus.publish_many(events[i:i + 200])


def dump(path: Path) -> dict[str, list[tuple]]:
    """Every row of every table and view, in a total order."""
    with eventlog.AnalystDB.open(path, read_only=True) as db:
        return {t: db.query(f"SELECT * FROM {t} ORDER BY ALL")[1] for t in eventlog.PROJECTION_TABLES}


def counts(path: Path) -> dict[str, int]:
    return {t: len(rows) for t, rows in dump(path).items()}


@pytest.fixture
async def bus(fresh_nats_server: str):
    connected = await Bus.connect(fresh_nats_server, service="test")
    try:
        yield connected
    finally:
        await connected.close()


async def test_replay_twice_gives_identical_tables(bus: Bus, tmp_path: Path, payload_samples) -> None:
    await publish(bus, study_log("s1", payload_samples) + study_log("s2", payload_samples))
    first = await eventlog.replay(bus, tmp_path / "a.duckdb")
    await eventlog.replay(bus, tmp_path / "b.duckdb", batch_size=7)  # other batch boundaries, same tables
    a, b = dump(tmp_path / "a.duckdb"), dump(tmp_path / "b.duckdb")
    assert a == b
    stream_counts = await bus.stream_counts()
    assert first.events == sum(stream_counts[s]["messages"] for s in eventlog.REPLAYED_STREAMS)
    assert len(a["steps"]) == 2 * 3 * 5 * 2 + 2  # the samples' TrialStep per study too
    assert len(a["studies"]) == 2 and len(a["models"]) == 2 and len(a["bank"]) == 2
    assert len(a["verifications"]) == 2 and not a["undecodable"] and not a["dead_letters"]
    with eventlog.AnalystDB.open(tmp_path / "a.duckdb", read_only=True) as db:
        _, rows = db.query("SELECT trial_id, status, candidate_key, ranks, accelerator_s FROM trials "
                           "WHERE study_id = 's1' AND trial_id <> 's1-t0' ORDER BY trial_id")
        assert [r[1] for r in rows] == ["ok", "ok", "oom"] and all(r[2] and r[3] == 2 for r in rows)
        _, failed = db.query("SELECT trial_id, reason, accelerator_s FROM failures WHERE study_id = 's1' "
                             "AND trial_id = 's1-t3'")
        assert failed == [("s1-t3", "out of memory", 30.0)]
        _, step = db.query("SELECT phases->>'backward', eval_loss FROM steps WHERE trial_id = 's1-t1' AND step = 5 "
                           "AND rank = 1")
        assert step == [("0.3", 9.0)]
        _, payload = db.query("SELECT payload FROM events WHERE type = 'TrialFinished' AND trial_id = 's1-t3'")
        assert json.loads(payload[0][0])["status"] == "oom"


async def test_raw_reader_and_nats_py_reader_read_the_same(bus: Bus, payload_samples) -> None:
    """``read_stream``'s own connection and its nats-py fallback deliver the same messages, from any start."""
    await publish(bus, study_log("s1", payload_samples))
    for stream in eventlog.REPLAYED_STREAMS:
        for start in (1, 5):
            raw = [m for chunk in [c async for c in stream_reader.read_stream(bus, stream, start, direct=True)] for m in chunk]
            ordered = [m for chunk in [c async for c in stream_reader.read_stream(bus, stream, start, direct=False)]
                       for m in chunk]
            assert raw == ordered
            assert [m[0] for m in raw] == sorted({m[0] for m in raw}) and (raw[0][0] == start if raw else start > 1)
    assert [c async for c in stream_reader.read_stream(bus, LIFECYCLE_STREAM, 10_000, direct=True)] == []


async def test_replay_after_new_events_appends_only_them(bus: Bus, tmp_path: Path, payload_samples) -> None:
    path = tmp_path / "a.duckdb"
    await publish(bus, study_log("s1", payload_samples))
    await eventlog.replay(bus, path)
    before = counts(path)
    with eventlog.AnalystDB.open(path, read_only=True) as db:
        positions = db.positions()

    new = [
        _event(ev.TrialMeasured(
            candidate_key="k", kind="search", status="invariant_violation", steps=5, warmup_steps=1, step_time_s=0.4,
            step_time_mad_s=0.01, step_time_with_warmup_s=0.41, tokens_per_s=1e4, mfu=None, flops_per_step=None,
            phases={}, peak_memory_bytes=[1, 2], per_rank_step_s=[0.4, 0.4], stragglers=[], loss_curve=[],
            eval_curve=[], optimizer_steps=5, tokens=20480, invariants_ok=False,
            invariants=[ev.InvariantResult(name="loss", ok=False, detail="diverged")]), 900, "s1", "s1-t1"),
        *[_event(ev.TrialStep(rank=0, world_size=1, step=s, loss=1.0, step_time_s=0.1, tokens=1, optimizer_steps=s,
                              peak_memory_bytes=1), 901 + s, "s1", "s1-t9") for s in range(4)],
    ]
    await publish(bus, new)
    stats = await eventlog.replay(bus, path)
    assert stats.events == 5
    after = counts(path)
    assert after["events"] == before["events"] + 5
    assert after["steps"] == before["steps"] + 4
    assert after["trials"] == before["trials"]  # t1 updated in place, t9 has steps only
    assert after["failures"] == before["failures"] + 1
    with eventlog.AnalystDB.open(path, read_only=True) as db:
        assert db.positions()[LIFECYCLE_STREAM] == positions[LIFECYCLE_STREAM] + 1
        assert db.positions()[TELEMETRY_STREAM] == positions[TELEMETRY_STREAM] + 4
        _, rows = db.query("SELECT status, finish_status, accelerator_s, failed_invariants FROM trials "
                           "WHERE trial_id = 's1-t1'")
        assert rows == [("invariant_violation", "ok", 10.0, '["loss"]')]

    # The same messages again — a repeated position — change nothing.
    whole = dump(path)
    old = [batch async for batch in stream_reader.read_stream(bus, TELEMETRY_STREAM)]
    with eventlog.AnalystDB.open(path) as db:
        assert sum(db.apply_batch(TELEMETRY_STREAM, batch) for batch in old) == 0
        assert db.apply_batch(LIFECYCLE_STREAM, [(1, "irsi.s1.StudyCreated", ev.encode(new[0]))]) == 0
    assert dump(path) == whole
    assert (await eventlog.replay(bus, path)).events == 0
    assert dump(path) == whole


async def test_undecodable_and_dead_letters_are_recorded_not_fatal(bus: Bus, tmp_path: Path, payload_samples) -> None:
    good = study_log("s1", payload_samples, trials=1, steps=1)
    await publish(bus, good[:3])
    await bus.publish_raw("irsi.s1.TrialProposed", b"{not json")
    mismatched = msgspec.json.decode(ev.encode(good[0]))
    mismatched["type"] = "TrialFinished"  # envelope says one type, payload another
    await bus.publish_raw("irsi.s1.TrialFinished", msgspec.json.encode(mismatched))
    await bus.publish_raw("irsi.telemetry.s1.t1", b'{"type": "TrialStep"}')
    letter = ev.DeadLetter(service="launcher", subject="irsi.s1.TrialLaunched", error="DecodeError: bad",
                           raw=b"\xff\x00raw", stream_seq=42, ts=T0)
    await bus.publish_raw(subjects.deadletter_subject("launcher"), msgspec.json.encode(letter))
    await bus.publish_raw(subjects.deadletter_subject("proposer"), b"also not json")
    await publish(bus, good[3:])

    await eventlog.replay(bus, tmp_path / "a.duckdb")
    tables = dump(tmp_path / "a.duckdb")
    assert len(tables["events"]) == len(good)
    undecodable = {(r[0], r[2]): r[3] for r in tables["undecodable"]}
    assert set(undecodable) == {
        (LIFECYCLE_STREAM, "irsi.s1.TrialProposed"), (LIFECYCLE_STREAM, "irsi.s1.TrialFinished"),
        (TELEMETRY_STREAM, "irsi.telemetry.s1.t1"), (LIFECYCLE_STREAM, "irsi.deadletter.proposer"),
    }
    assert "does not match" in undecodable[(LIFECYCLE_STREAM, "irsi.s1.TrialFinished")]
    assert [r[1:] for r in tables["undecodable"] if r[2] == "irsi.s1.TrialProposed"][0][-1] == b"{not json"
    [dead] = tables["dead_letters"]
    assert dead[2:8] == ("irsi.deadletter.launcher", "launcher", "irsi.s1.TrialLaunched", 42, "DecodeError: bad",
                         b"\xff\x00raw")
    with eventlog.AnalystDB.open(tmp_path / "a.duckdb", read_only=True) as db:
        counts_ = await bus.stream_counts()
        assert db.positions()[LIFECYCLE_STREAM] == counts_[LIFECYCLE_STREAM]["last_seq"]
        assert db.positions()[TELEMETRY_STREAM] == counts_[TELEMETRY_STREAM]["last_seq"]
        assert db.positions()[BANK_STREAM] == counts_[BANK_STREAM]["last_seq"]


async def test_sql_command_formats_and_errors(bus: Bus, tmp_path: Path, payload_samples, capsys) -> None:
    path = tmp_path / "a.duckdb"
    await publish(bus, study_log("s1", payload_samples))
    await eventlog.replay(bus, path)

    def args(sql: str, fmt: str = "table", db: Path | None = path) -> argparse.Namespace:
        return argparse.Namespace(sql=sql, db=db, format=fmt, data_dir=tmp_path / "data", nats_url=None)

    query = "SELECT trial_id, status, accelerator_s FROM trials WHERE trial_id <> 's1-t0' ORDER BY trial_id"
    assert await sql_command.run(args(query)) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["trial_id", "status", "accelerator_s"]
    assert table[2].split() == ["s1-t1", "ok", "10.0"] and table[-1] == "(3 rows)"
    assert await sql_command.run(args(query, "csv")) == 0
    assert capsys.readouterr().out.splitlines() == [
        "trial_id,status,accelerator_s", "s1-t1,ok,10.0", "s1-t2,ok,20.0", "s1-t3,oom,30.0"]
    assert await sql_command.run(args("SELECT trial_id, ts FROM steps ORDER BY seq LIMIT 1", "json")) == 0
    sample_step_ts = T0 + timedelta(seconds=ev.EVENT_TYPES.index("TrialStep"))
    assert json.loads(capsys.readouterr().out) == [
        {"trial_id": "s1-t0", "ts": sample_step_ts.isoformat().replace("+00:00", "Z")}]

    with pytest.raises(UserError, match="syntax error") as bad_sql:
        await sql_command.run(args("SELEC 1"))
    assert bad_sql.value.exit_code == 2
    (tmp_path / "junk.duckdb").write_text("not a database")
    for unopenable in (tmp_path / "junk.duckdb", tmp_path / "missing.duckdb"):
        with pytest.raises(UserError, match="cannot open analyst DB"):
            await sql_command.run(args("SELECT 1", db=unopenable))
    with pytest.raises(UserError, match="no analyst snapshot"):
        await sql_command.run(args("SELECT 1", db=None))


def test_sql_cli_exit_codes(tmp_path: Path) -> None:
    """As a user runs it: one ``error:`` line, exit 2, no traceback."""
    import subprocess
    import sys

    db = tmp_path / "x.duckdb"
    with eventlog.AnalystDB.open(db):
        pass
    base = [sys.executable, "-m", "infrarsi.cli", "--data-dir", str(tmp_path), "sql"]
    ok = subprocess.run([*base, "SELECT count(*) AS n FROM events", "--db", str(db), "--format", "csv"],
                        capture_output=True, text=True, timeout=60)
    assert (ok.returncode, ok.stdout) == (0, "n\n0\n"), ok.stderr
    for argv in (["SELECT nope FROM events", "--db", str(db)], ["SELECT 1", "--db", str(tmp_path / "none.duckdb")]):
        bad = subprocess.run([*base, *argv], capture_output=True, text=True, timeout=60)
        assert bad.returncode == 2 and bad.stderr.startswith("error: ") and "Traceback" not in bad.stderr, bad.stderr


async def test_replay_command_rebuilds_atomically_and_refuses_a_held_file(
    bus: Bus, fresh_nats_server: str, tmp_path: Path, payload_samples, capsys
) -> None:
    from infrarsi.commands import replay as replay_command

    await publish(bus, study_log("s1", payload_samples))
    path = tmp_path / "a.duckdb"
    args = argparse.Namespace(db=path, from_scratch=False, batch_size=None, no_progress=True,
                              nats_url=fresh_nats_server, data_dir=tmp_path / "data")
    assert await replay_command.run(args) == 0
    assert "events/s" in capsys.readouterr().out
    incremental = dump(path)
    args.from_scratch = True
    assert await replay_command.run(args) == 0
    assert dump(path) == incremental
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temp file left
    with eventlog.AnalystDB.open(path):  # the reporter, say, holds it
        import subprocess
        import sys

        held = subprocess.run(
            [sys.executable, "-m", "infrarsi.cli", "--nats-url", fresh_nats_server, "replay", "--db", str(path)],
            capture_output=True, text=True, timeout=60,
        )
    assert held.returncode == 2 and held.stderr.startswith("error: cannot write") and "Traceback" not in held.stderr


async def test_an_interrupted_read_resumes_from_the_stored_position(
    bus: Bus, tmp_path: Path, payload_samples, monkeypatch
) -> None:
    """A read that stalls mid-stream (``StreamReadError``) after some batches were written: the catch-up
    resumes from the position stored with the last written batch, and the result equals an uninterrupted replay."""
    await publish(bus, study_log("s1", payload_samples, trials=6, steps=20) + study_log("s2", payload_samples))
    await eventlog.replay(bus, tmp_path / "clean.duckdb", batch_size=50)

    real_read_stream = stream_reader.read_stream
    failures: list[int] = []

    async def flaky(bus_, stream, start_seq=1, **kwargs):
        delivered = 0
        async for chunk in real_read_stream(bus_, stream, start_seq, **kwargs):
            for i in range(0, len(chunk), 25):  # small chunks: several batches are written before the stall
                yield chunk[i:i + 25]
                delivered += len(chunk[i:i + 25])
                if stream == TELEMETRY_STREAM and not failures and delivered >= 150:
                    failures.append(start_seq)
                    raise stream_reader.StreamReadError("stalled (test)")

    monkeypatch.setattr(eventlog.catchup, "read_stream", flaky)
    stats = await eventlog.replay(bus, tmp_path / "resumed.duckdb", batch_size=50)
    assert failures == [1]
    assert dump(tmp_path / "resumed.duckdb") == dump(tmp_path / "clean.duckdb")
    assert stats.events == sum(counts(tmp_path / "clean.duckdb")[t] for t in ("events",))
