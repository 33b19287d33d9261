"""`infrarsi bank list|show|query|export|import` against a real nats-server, as the CLI module is called."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import msgspec
import pytest
from infrarsi import cli
from infrarsi import events as ev
from infrarsi.bus.embedded import EmbeddedServer
from infrarsi.commands import bank as bank_cmd

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


def parse(*argv: str) -> argparse.Namespace:
    """``infrarsi bank ARGV…`` parsed as the CLI parses it (global options on the verb included)."""
    parser, _ = cli.build_parser(load="bank")
    return parser.parse_args(["bank", *argv])


def entry(study: str, accelerator: str) -> ev.BankEntry:
    meta = ev.BankMeta(accelerator=accelerator, generation="", device_memory_bytes=80 * 2**30, interconnect="ib",
                       nodes=8, devices_per_node=8, parallelism={"dp": 64}, model_family="dense",
                       model_params=6.7e9, seq_len=4096, global_batch=512, micro_batch=1, precision="bf16")
    return ev.BankEntry(entry_id=ev.derived_id(study, "BankEntry"), origin_study=study, meta=meta, time_effects=[
        ev.Effect(feature="flash_attention", prior_mean=-0.15, prior_std=0.1, post_mean=-0.2, post_std=0.03)],
        memory_effects=[], winners=[ev.Candidate(knobs={"micro_batch": 2})])


async def test_bank_cli_round_trip(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFRARSI_CLUSTER", "cluster-a")
    with EmbeddedServer.start(tmp_path / "nats", server_name="bank-cli") as server:
        url = ["--nats-url", server.url, "--data-dir", str(tmp_path)]
        bare = tmp_path / "in.jsonl"
        bare.write_bytes(b"".join(msgspec.json.encode(entry(s, a)) + b"\n" for s, a in
                                  (("s1", "A100-80G"), ("s2", "H100-80G"))))
        assert await bank_cmd.run(parse(*url, "import", str(bare))) == 0
        assert "imported 2 entries (0 already present)" in capsys.readouterr().err

        assert await bank_cmd.run(parse(*url, "list")) == 0
        out = capsys.readouterr()
        assert "2 entries" in out.err and "A100-80G" in out.out and "cluster-a" in out.out

        s1 = ev.derived_id("s1", "BankEntry")
        assert await bank_cmd.run(parse(*url, "show", s1[:10])) == 0
        shown = json.loads(capsys.readouterr().out)
        assert shown["payload"]["origin_study"] == "s1" and shown["cluster_id"] == "cluster-a"

        assert await bank_cmd.run(parse(*url, "query", "SELECT origin_study, n_winners FROM bank "
                                         "WHERE accelerator LIKE 'H100%'", "--json")) == 0
        assert json.loads(capsys.readouterr().out) == {"origin_study": "s2", "n_winners": 1}

        parquet = tmp_path / "bank.parquet"
        assert await bank_cmd.run(parse(*url, "export", str(parquet))) == 0
        assert parquet.stat().st_size > 0
        capsys.readouterr()
        # importing the export again publishes the same event ids: JetStream drops them as duplicates
        assert await bank_cmd.run(parse(*url, "import", str(parquet))) == 0
        assert "imported 0 entries (2 already present)" in capsys.readouterr().err

        assert await cli.invoke(bank_cmd.run, parse(*url, "show", "zzz")) == 1
