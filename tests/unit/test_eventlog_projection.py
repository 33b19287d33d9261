"""The analyst projection without a server: decoding, idempotence by sequence, batch-independence, snapshots."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec
import pytest
from infrarsi import eventlog
from infrarsi import events as ev
from infrarsi.bus import reader as stream_reader
from infrarsi.bus import subjects

T0 = datetime(2026, 3, 1, tzinfo=UTC)


def _step(n: int, trial: str = "t1", **changes) -> ev.Event:
    payload = ev.TrialStep(rank=n % 2, world_size=2, step=n, loss=1.0 / (n + 1), step_time_s=0.5,
                           phases={"forward": 0.2}, tokens=64, optimizer_steps=n, peak_memory_bytes=10 + n)
    return ev.Event(event_id=f"e{n}", type="TrialStep", study_id="s1", trial_id=trial, cluster_id="c",
                    source="probe", ts=T0 + timedelta(seconds=n), payload=msgspec.structs.replace(payload, **changes))


def _messages(events: list[ev.Event], first_seq: int = 1) -> list[eventlog.StreamMessage]:
    return [(first_seq + i, subjects.subject_for(e), ev.encode(e)) for i, e in enumerate(events)]


def dump(db: eventlog.AnalystDB) -> dict[str, list[tuple]]:
    return {t: db.query(f"SELECT * FROM {t} ORDER BY ALL")[1] for t in eventlog.PROJECTION_TABLES}


def _variants() -> list[bytes]:
    good = msgspec.json.decode(ev.encode(_step(3)))
    out = [ev.encode(_step(3))]
    for mutate in (
        lambda d: d["payload"].pop("type"),
        lambda d: d["payload"].__setitem__("type", "TrialFinished"),
        lambda d: d.__setitem__("type", "TrialFinished"),
        lambda d: d["payload"].__setitem__("rank", "zero"),
        lambda d: d["payload"].__setitem__("phases", {"forward": "fast"}),
        lambda d: d.__setitem__("ts", "yesterday"),
        lambda d: d.pop("study_id"),
        lambda d: d["payload"].pop("tokens"),
    ):
        bad = msgspec.json.decode(msgspec.json.encode(good))
        mutate(bad)
        out.append(msgspec.json.encode(bad))
    return out + [b"{", b"[]"]


@pytest.mark.parametrize("data", _variants())
def test_fast_step_decoder_accepts_exactly_what_events_decode_accepts(data: bytes) -> None:
    try:
        expected = ev.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        expected = None
    try:
        envelope, step = eventlog.decode_step(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        assert expected is None or expected.type != "TrialStep"
        return
    assert expected is not None and step == expected.payload and envelope.event_id == expected.event_id


def test_reply_subject_sequences_v1_and_v2() -> None:
    assert stream_reader._sequences("$JS.ACK.IRSI.c1.1.42.7.1764690000000000000.3") == (42, 7)
    assert stream_reader._sequences("$JS.ACK.hub.ACC.IRSI.c1.1.42.7.1764690000000000000.3.tok") == (42, 7)


def test_apply_batch_is_idempotent_and_independent_of_batch_boundaries(tmp_path: Path) -> None:
    msgs = _messages([_step(n) for n in range(1, 40)])
    with eventlog.AnalystDB.open(tmp_path / "one.duckdb") as one, eventlog.AnalystDB.open(tmp_path / "many.duckdb") as many:
        assert one.apply_batch(eventlog.TELEMETRY_STREAM, msgs) == 39
        for i in range(0, len(msgs), 5):
            many.apply_batch(eventlog.TELEMETRY_STREAM, msgs[i:i + 5])
        assert dump(one) == dump(many)
        before = dump(one)
        assert one.apply_batch(eventlog.TELEMETRY_STREAM, msgs[10:20]) == 0  # a repeated position
        assert one.apply_batch(eventlog.TELEMETRY_STREAM, msgs[30:] + _messages([_step(40)], 40)) == 1
        assert one.position(eventlog.TELEMETRY_STREAM) == 40
        assert len(dump(one)["steps"]) == len(before["steps"]) + 1


def test_bad_messages_go_to_undecodable(tmp_path: Path) -> None:
    msgs = [(1, "irsi.telemetry.s1.t1", b"nope"), *_messages([_step(2)], 2), (3, "irsi.deadletter.x", b"{}")]
    with eventlog.AnalystDB.open(tmp_path / "db.duckdb") as db:
        assert db.apply_batch(eventlog.TELEMETRY_STREAM, msgs) == 3
        _, rows = db.query("SELECT seq, subject, raw FROM undecodable ORDER BY seq")
        assert [(r[0], r[1]) for r in rows] == [(1, "irsi.telemetry.s1.t1"), (3, "irsi.deadletter.x")]
        assert db.query("SELECT count(*) FROM steps")[1] == [(1,)]


def test_snapshot_is_a_readable_copy_and_the_writer_keeps_its_lock(tmp_path: Path) -> None:
    path, snapshot = tmp_path / "analyst.duckdb", tmp_path / "analyst.snapshot.duckdb"
    with eventlog.AnalystDB.open(path) as db:
        db.apply_batch(eventlog.TELEMETRY_STREAM, _messages([_step(n) for n in range(1, 5)]))
        db.publish_snapshot(snapshot)
        with eventlog.AnalystDB.open(snapshot, read_only=True) as copy:
            assert dump(copy) == dump(db)
        second = subprocess.run(
            [sys.executable, "-c", f"from infrarsi.eventlog import AnalystDB; AnalystDB.open({str(path)!r})"],
            capture_output=True, text=True, timeout=60,
        )
        assert second.returncode != 0 and "lock" in second.stderr


def test_events_view_rebuilds_step_payloads(tmp_path: Path) -> None:
    """``events`` shows a TrialStep once, with the payload's fields and values as published."""
    shape = ev.WorkloadShape(parameters=10, layers=2, hidden=8, seq_len=4, sources={"layers": "config"})
    steps = [_step(1, eval_loss=2.5, eval_tokens=7, shape=shape), _step(2, flops=1e15, loss_tokens=None, loss=None)]
    with eventlog.AnalystDB.open(tmp_path / "db.duckdb") as db:
        db.apply_batch(eventlog.TELEMETRY_STREAM, _messages(steps))
        _, rows = db.query("SELECT stream, seq, subject, event_id, type, study_id, trial_id, cluster_id, source, ts, "
                           "schema_version, payload FROM events ORDER BY seq")
        assert db.query("SELECT count(*) FROM lifecycle_events")[1] == [(0,)]
    assert len(rows) == 2
    for (stream, _seq, subject, event_id, type_, study, trial, cluster, source, ts, version, payload), e in zip(
        rows, steps, strict=True
    ):
        assert (stream, subject, event_id, type_, study, trial, cluster, source, ts, version) == (
            eventlog.TELEMETRY_STREAM, subjects.subject_for(e), e.event_id, "TrialStep", e.study_id, e.trial_id,
            e.cluster_id, e.source, e.ts, e.schema_version)
        assert msgspec.json.decode(payload) == msgspec.json.decode(msgspec.json.encode(e.payload))


_HAND_WRITTEN_STEPS = [
    # another producer's spelling of the same catalog: whitespace, field order, an int for a float, omitted
    # defaults (phases, loss_tokens, flops, wall_time, trial_id, schema_version), unknown fields, non-ASCII
    b'{ "type": "TrialStep", "payload": {"tokens": 64, "step": 1, "rank": 0, "world_size": 1, "loss": 2,'
    b' "step_time_s": 0.5, "optimizer_steps": 1, "peak_memory_bytes": 9, "type": "TrialStep", "extra": [1]},'
    b' "event_id": "h1", "study_id": "s\xc3\xa9", "cluster_id": "c", "source": "probe", "ts": "2026-03-01T10:00:00+02:00",'
    b' "unknown": {"a": 1}}',
    # a naive timestamp (read as UTC), every optional number set, phases with spaces
    b'{"event_id":"h2","type":"TrialStep","study_id":"s1","trial_id":"t9","cluster_id":"c","source":"probe",'
    b'"ts":"2026-03-01T09:00:00.5","schema_version":1,"payload":{"type":"TrialStep","rank":1,"world_size":2,'
    b'"step":7,"loss":1.25e-3,"step_time_s":1E0,"phases":{ "forward" : 0.25, "backward":0.5 },"tokens":128,'
    b'"optimizer_steps":7,"loss_tokens":100,"peak_memory_bytes":12345678901,"flops":3.5e14,"mfu":0.5,'
    b'"eval_loss":2.5,"eval_tokens":64,"wall_time":1772355600.25}}',
]


def test_step_columns_are_what_events_decode_reads_from_any_valid_spelling(tmp_path: Path) -> None:
    """DuckDB projects a step's columns from the message text msgspec validated: every column must equal
    the value ``events.decode`` gives, whatever valid JSON spelling the producer used."""
    msgs = [(i + 1, "irsi.telemetry.x.t", data) for i, data in enumerate(_HAND_WRITTEN_STEPS)]
    with eventlog.AnalystDB.open(tmp_path / "db.duckdb") as db:
        assert db.apply_batch(eventlog.TELEMETRY_STREAM, msgs) == 2
        assert db.query("SELECT count(*) FROM undecodable")[1] == [(0,)]
        columns, rows = db.query("SELECT * FROM steps ORDER BY seq")
    for row, (_seq, _subject, data) in zip(rows, msgs, strict=True):
        got, e = dict(zip(columns, row, strict=True)), ev.decode(data)
        p = e.payload
        assert isinstance(p, ev.TrialStep)
        expected_ts = e.ts if e.ts.tzinfo else e.ts.replace(tzinfo=UTC)
        assert got["ts"] == expected_ts
        assert msgspec.json.decode(got.pop("phases")) == p.phases
        for name in ("study_id", "trial_id", "cluster_id", "source", "event_id", "schema_version"):
            assert got[name] == getattr(e, name), name
        for name in ("rank", "world_size", "step", "loss", "step_time_s", "tokens", "optimizer_steps", "loss_tokens",
                     "peak_memory_bytes", "flops", "mfu", "eval_loss", "eval_tokens", "wall_time"):
            assert got[name] == getattr(p, name) and type(got[name]) is type(getattr(p, name)), name


def test_agent_exchanges_pair_each_question_with_its_answer(tmp_path: Path) -> None:
    asked = ev.AgentAsked(ask_id="q1", purpose="proposals", model="m", endpoint="http://x/v1",
                          messages=[ev.AgentMessage(role="user", content="make it faster")], max_tokens=100)
    answered = ev.AgentAnswered(ask_id="q1", ok=True, text="{}", prompt_tokens=30, completion_tokens=5,
                                refused=[ev.AgentRefusal(kind="not_json", item="answer", detail="x")])
    events = [ev.Event(event_id=f"a{i}", type=type(p).__name__, study_id="s1", cluster_id="c", source="proposer",
                       ts=T0 + timedelta(seconds=i), payload=p) for i, p in enumerate((asked, answered))]
    with eventlog.AnalystDB.open(tmp_path / "agent.duckdb") as db:
        db.apply_batch(subjects.LIFECYCLE_STREAM, _messages(events))
        _cols, rows = db.query("SELECT ask_id, ok, prompt_tokens, completion_tokens, refused, answer, "
                               "messages->0->>'content' FROM agent_exchanges")
    assert rows == [("q1", True, 30, 5, 1, "{}", "make it faster")]


def test_deeply_nested_messages_go_to_undecodable_on_both_streams(tmp_path: Path) -> None:
    deep = b'{"deep": ' + b"[" * 5000 + b"]" * 5000 + b', "type": "TrialStep"}'
    with eventlog.AnalystDB.open(tmp_path / "db.duckdb") as db:
        assert db.apply_batch(eventlog.TELEMETRY_STREAM, [(1, "irsi.telemetry.s1.t1", deep), *_messages([_step(2)], 2)]) == 2
        assert db.apply_batch(eventlog.LIFECYCLE_STREAM, [(1, "irsi.s1.StudyCreated", deep), (2, "irsi.deadletter.x", deep)]) == 2
        assert db.query("SELECT count(*) FROM undecodable")[1] == [(3,)]
        assert db.query("SELECT count(*) FROM steps")[1] == [(1,)]
