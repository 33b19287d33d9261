"""The reporter process keeps the analyst DB current while analysts query its snapshot concurrently."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

import pytest
from infrarsi import eventlog
from infrarsi.bus.client import LIFECYCLE_STREAM, TELEMETRY_STREAM, Bus
from infrarsi.commands import sql as sql_command
from test_eventlog import publish, study_log

pytestmark = pytest.mark.integration


async def test_reporter_keeps_db_current_while_sql_reads(
    fresh_nats_server: str, spawn_service, wait_answering, wait_for, tmp_path: Path, payload_samples, capsys
) -> None:
    bus = await Bus.connect(fresh_nats_server, service="test")
    try:
        data_dir = tmp_path / "data"  # what spawn_service passes as --data-dir
        snapshot = eventlog.snapshot_path(data_dir)
        await publish(bus, study_log("s1", payload_samples))
        reporter = spawn_service("reporter", fresh_nats_server)
        await wait_answering(bus, reporter)
        counts = await bus.stream_counts()
        await eventlog.wait_until(snapshot, TELEMETRY_STREAM, counts[TELEMETRY_STREAM]["last_seq"], timeout=30)

        def args(sql: str) -> argparse.Namespace:
            return argparse.Namespace(sql=sql, db=None, format="json", data_dir=data_dir, nats_url=None)

        async def read_while_written(stop: asyncio.Event) -> list[int]:
            seen = []
            while not stop.is_set():
                assert await sql_command.run(args("SELECT count(*) AS n FROM steps")) == 0
                seen.append(json.loads(capsys.readouterr().out)[0]["n"])
                await asyncio.sleep(0.02)
            return seen

        stop = asyncio.Event()
        reader = asyncio.create_task(read_while_written(stop))
        for study in ("s2", "s3", "s4"):
            await publish(bus, study_log(study, payload_samples, trials=4, steps=20))
            await asyncio.sleep(0.3)

        async def lifecycle_handled() -> bool:
            # The reporter publishes a study's bank entry while it handles the study's events (and acks after):
            # once its lifecycle consumer has nothing pending or unacked, no entry is still on its way.
            infos = [c for c in await bus.js.consumers_info(LIFECYCLE_STREAM) if c.name.startswith("reporter")]
            return bool(infos) and all(c.num_pending == 0 and c.num_ack_pending == 0 for c in infos)

        await wait_for(lifecycle_handled, timeout_s=60.0)
        counts = await bus.stream_counts()
        for stream in eventlog.REPLAYED_STREAMS:
            await eventlog.wait_until(snapshot, stream, counts[stream]["last_seq"], timeout=30)
        stop.set()
        seen = await reader
        assert len(seen) > 3 and seen == sorted(seen)  # every read saw a consistent, never shrinking DB
        assert seen[-1] <= counts[TELEMETRY_STREAM]["messages"]
        assert await sql_command.run(args("SELECT count(*) AS steps, (SELECT count(*) FROM events) AS events FROM steps")) == 0
        final = json.loads(capsys.readouterr().out)[0]
        assert final == {"steps": counts[TELEMETRY_STREAM]["messages"],
                         "events": sum(counts[s]["messages"] for s in eventlog.REPLAYED_STREAMS)}

        # One writer: a second reporter on the same data dir cannot open the DB and exits non-zero.
        second = spawn_service("reporter", fresh_nats_server)
        assert await asyncio.to_thread(second.process.wait, 60) != 0
        assert "analyst" in second.log()
        assert reporter.terminate() == 0
    finally:
        await bus.close()
