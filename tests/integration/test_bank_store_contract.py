"""The experience bank's contract, run against every place the bank is held.

However bank events reach a store — in any order, repeated, an old revision after a new one — reading it back
gives one entry per ``entry_id``: its latest revision (later ``ts``, then larger event id), sorted by entry id.
The stores: the JetStream stream a cluster publishes to (read with ``read_bank_entries``), the DuckDB table
(``project_events`` / ``load_entries``), and the JSONL and Parquet files of ``infrarsi bank export`` /
``import``. A new store (a hub's aggregate, an object store) adds a ``BankStoreUnderTest`` to ``STORES``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from datetime import UTC, datetime, timedelta
from pathlib import Path

import duckdb
import msgspec
import pytest
from infrarsi import events as ev
from infrarsi.bank.distil import bank_event
from infrarsi.bank.federation import read_bank_entries
from infrarsi.bank.store import (
    create_bank_tables,
    export_bank,
    load_entries,
    parse_import_file,
    project_events,
)
from infrarsi.bus.client import Bus
from infrarsi.bus.subjects import BANK_STREAM

META = ev.BankMeta(accelerator="A100-80G", generation="ampere", device_memory_bytes=80 * 2**30, interconnect="ib",
                   nodes=1, devices_per_node=8, parallelism={"dp": 8}, model_family="dense", model_params=7e9,
                   seq_len=4096, global_batch=512, micro_batch=1, precision="bf16")


class BankStoreUnderTest(ABC):
    id: str

    @abstractmethod
    async def round_trip(self, events: list[ev.Event], bus: Bus, tmp: Path) -> list[ev.BankEntry]:
        """Put ``events`` into the store in this order; read the bank back."""


def _table(events: list[ev.Event]) -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    create_bank_tables(con)
    project_events(con, events)
    return con


class DuckDBStore(BankStoreUnderTest):
    id = "duckdb"

    async def round_trip(self, events: list[ev.Event], bus: Bus, tmp: Path) -> list[ev.BankEntry]:
        return load_entries(_table(events))


class FileStore(BankStoreUnderTest):
    def __init__(self, suffix: str) -> None:
        self.suffix = suffix
        self.id = suffix.lstrip(".")

    async def round_trip(self, events: list[ev.Event], bus: Bus, tmp: Path) -> list[ev.BankEntry]:
        path = tmp / f"bank{self.suffix}"
        export_bank(_table(events), path)
        return load_entries(_table(parse_import_file(path, cluster_id="elsewhere")))


class StreamStore(BankStoreUnderTest):
    """The cluster's ``IRSI_BANK`` on a real server (shared by the session: only this test's entries count)."""

    id = "stream"

    async def round_trip(self, events: list[ev.Event], bus: Bus, tmp: Path) -> list[ev.BankEntry]:
        for event in events:
            await bus.publish(event)
        ours = {e.payload.entry_id for e in events if isinstance(e.payload, ev.BankEntry)}
        return [e for e in await read_bank_entries(bus, [BANK_STREAM]) if e.entry_id in ours]


STORES: list[BankStoreUnderTest] = [DuckDBStore(), FileStore(".jsonl"), FileStore(".parquet"), StreamStore()]


def revision(study: str, n_winners: int, minutes: int) -> ev.Event:
    entry = ev.BankEntry(entry_id=ev.derived_id(study, "BankEntry"), origin_study=study, meta=META, time_effects=[],
                         memory_effects=[], winners=[ev.Candidate(knobs={"mb": i}) for i in range(n_winners)],
                         failures=[ev.BankFailure(kind="oom", candidate=ev.Candidate(knobs={"mb": 64}), detail="oom",
                                                  censored_peak_bytes=79e9, capacity_bytes=80e9)])
    return msgspec.structs.replace(bank_event(entry, cluster_id="cluster-a"),
                                   ts=datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=minutes))


@pytest.mark.parametrize("store", STORES, ids=lambda s: s.id)
async def test_every_store_keeps_the_latest_revision_of_each_entry(store: BankStoreUnderTest, bus: Bus,
                                                                  tmp_path: Path) -> None:
    a, b = ev.new_id(), ev.new_id()
    a_old, a_new, b_only = revision(a, 1, minutes=0), revision(a, 2, minutes=5), revision(b, 3, minutes=1)
    # the newer revision first, the older one after it, and a copy: none of it may change the answer
    entries = await store.round_trip([a_new, b_only, a_old, b_only], bus, tmp_path)
    expected = sorted([a_new.payload, b_only.payload], key=lambda e: e.entry_id)  # type: ignore[union-attr]
    assert entries == expected
    assert entries[0].failures[0].censored_peak_bytes == 79e9, "the typed failures survive the store"


@pytest.mark.parametrize("store", STORES, ids=lambda s: s.id)
async def test_an_empty_bank_reads_back_empty(store: BankStoreUnderTest, bus: Bus, tmp_path: Path) -> None:
    assert await store.round_trip([], bus, tmp_path) == []
