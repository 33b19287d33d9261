"""The DuckDB bank table: idempotent by stream position, latest revision wins in any order, export/import."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import msgspec
import pytest
from infrarsi import events as ev
from infrarsi.bank.distil import bank_event
from infrarsi.bank.federation import latest_by_entry
from infrarsi.bank.store import create_bank_tables, export_bank, load_entries, parse_import_file, project_bank

META = ev.BankMeta(accelerator="A100-80G", generation="ampere", device_memory_bytes=80 * 2**30, interconnect="ib",
                   nodes=8, devices_per_node=8, parallelism={"dp": 64}, model_family="dense", model_params=7e9,
                   seq_len=4096, global_batch=512, micro_batch=1, precision="bf16")


def event(study: str, n_winners: int = 0, minutes: int = 0, cluster: str = "cluster-a") -> ev.Event:
    entry = ev.BankEntry(entry_id=ev.derived_id(study, "BankEntry"), origin_study=study, meta=META, time_effects=[],
                         memory_effects=[], winners=[ev.Candidate(knobs={"mb": i}) for i in range(n_winners)])
    e = bank_event(entry, cluster_id=cluster)
    return msgspec.structs.replace(e, ts=datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=minutes))


def table(*batches: tuple[str, list[tuple[int, ev.Event]]]) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    create_bank_tables(con)
    for stream, batch in batches:
        project_bank(con, stream, batch)
    return con


def rows(con: duckdb.DuckDBPyConnection) -> list[tuple]:
    return con.execute("SELECT * FROM bank ORDER BY entry_id").fetchall()


def test_projection_is_idempotent_by_stream_sequence() -> None:
    batch = [(1, event("s1")), (2, event("s2"))]
    con = table(("IRSI_BANK", batch))
    assert project_bank(con, "IRSI_BANK", batch) == 0
    assert con.execute("SELECT last_seq FROM bank_positions").fetchall() == [(2,)]
    assert [e.origin_study for e in load_entries(con)] == sorted(["s1", "s2"], key=lambda s: ev.derived_id(s, "BankEntry"))


def test_latest_revision_wins_whatever_the_order_and_the_stream() -> None:
    old, new = event("s1", 1, minutes=0), event("s1", 2, minutes=5)
    a = table(("IRSI_BANK", [(1, old), (2, new)]))
    b = table(("IRSI_BANK_SHARED", [(1, new)]), ("IRSI_BANK", [(7, old)]))
    assert rows(a) == rows(b)
    assert len(rows(a)) == 1 and load_entries(a)[0].winners == new.payload.winners  # type: ignore[union-attr]
    assert latest_by_entry([new, old, old])[new.payload.entry_id] == new  # type: ignore[union-attr]


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_export_then_import_round_trips(tmp_path: Path, suffix: str) -> None:
    con = table(("IRSI_BANK", [(1, event("s1", 1)), (2, event("s2", 3, cluster="cluster-b"))]))
    path = tmp_path / f"bank{suffix}"
    assert export_bank(con, path) == 2
    back = parse_import_file(path, cluster_id="elsewhere")
    assert [e.event_id for e in back] == [r[3] for r in rows(con)]  # same ids: re-import is deduplicated
    assert table(("file", list(enumerate(back, 1)))).execute("SELECT * FROM bank ORDER BY entry_id").fetchall() == rows(con)


def test_import_accepts_bare_entries_and_rejects_other_events(tmp_path: Path) -> None:
    entry = event("s1").payload
    path = tmp_path / "bare.jsonl"
    path.write_bytes(msgspec.json.encode(entry) + b"\n")
    [e] = parse_import_file(path, cluster_id="cluster-b")
    assert e.cluster_id == "cluster-b" and e.payload == entry
    other = ev.make_event(ev.StudyFinished(reason="done", trials=1, accelerator_s=1.0), study_id="s", source="t")
    path.write_bytes(ev.encode(other) + b"\n")
    with pytest.raises(ValueError, match="not a BankEntry"):
        parse_import_file(path, cluster_id="x")
    with pytest.raises(ValueError, match="unknown format"):
        parse_import_file(tmp_path / "bank.csv", cluster_id="x")
