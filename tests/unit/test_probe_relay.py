"""The launcher's relay of a trial's probe files (``infrarsi_services.launcher.relay``): only this trial's steps
are published, complete lines only, each once; files that are not plain files are never opened."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from infrarsi import events as ev
from infrarsi_services.launcher.relay import StepRelay, own_step, probe_files


def step_line(study: str, trial: str, step: int) -> bytes:
    payload = ev.TrialStep(rank=0, world_size=1, step=step, loss=1.0, step_time_s=0.1, tokens=8, optimizer_steps=step + 1,
                           peak_memory_bytes=1)  # fmt: skip
    return ev.encode(ev.make_event(payload, study_id=study, trial_id=trial, source="probe"))


def test_own_step_refuses_another_trial_or_study_and_other_types() -> None:
    assert own_step(step_line("s", "t", 3), "s", "t") is not None
    assert own_step(step_line("s", "victim", 3), "s", "t") is None
    assert own_step(step_line("other", "t", 3), "s", "t") is None
    finished = ev.encode(ev.make_event(ev.StudyFinished(reason="x", trials=0, accelerator_s=0.0), study_id="s",
                                       trial_id="t", source="proposer"))  # fmt: skip
    assert own_step(finished, "s", "t") is None
    assert own_step(b"SUAGARBAGE", "s", "t") is None


def test_relay_publishes_own_complete_lines_once(tmp_path: Path) -> None:
    sent: list[tuple[bytes, str]] = []

    async def publish(line: bytes, msg_id: str) -> None:
        sent.append((line, msg_id))

    relay = StepRelay(tmp_path, "s", "t", publish)
    path = tmp_path / "probe-rank0.jsonl"
    first, forged, second = step_line("s", "t", 0), step_line("s", "victim", 0), step_line("s", "t", 1)
    path.write_bytes(first + b"\n" + forged + b"\n" + second[:10])  # the last line still being written
    asyncio.run(relay.poll())
    assert sent == [(first, "t:0:step:0")] and relay.refused == 1
    with open(path, "ab") as out:
        out.write(second[10:] + b"\n")
    asyncio.run(relay.poll())
    asyncio.run(relay.poll())
    assert sent == [(first, "t:0:step:0"), (second, "t:0:step:1")]


def test_links_and_fifos_are_never_opened(tmp_path: Path) -> None:
    secret = tmp_path / "secret.nk"
    secret.write_bytes(step_line("s", "t", 0) + b"\n")  # even a file of valid steps, reached through a link
    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "probe-rank0.jsonl").symlink_to(secret)
    os.mkfifo(probe / "probe-rank1.jsonl")  # opening it for reading would block the launcher
    (probe / "probe-rank2.jsonl").write_bytes(step_line("s", "t", 0) + b"\n")
    assert [p.name for p in probe_files(probe)] == ["probe-rank2.jsonl"]
    sent: list[str] = []

    async def publish(line: bytes, msg_id: str) -> None:
        sent.append(msg_id)

    asyncio.run(StepRelay(probe, "s", "t", publish).poll())
    assert sent == ["t:2:step:0"]


def test_the_launchers_file_reads_never_follow_a_link_or_block_on_a_fifo(tmp_path: Path) -> None:
    import re

    from infrarsi_services.launcher.output import GrowingFile, read_regular

    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "seed.nk").write_bytes(b"SUSECRET\n")
    (tmp_path / "link").symlink_to(tmp_path / "seed.nk")
    assert read_regular(tmp_path / "fifo") == b"" and read_regular(tmp_path / "link") == b""
    assert GrowingFile(tmp_path / "fifo", 0.0, re.compile(rb"\n")).read_lines(final=True)[0] == [b""]
    assert GrowingFile(tmp_path / "link", 0.0, re.compile(rb"\n")).read_lines(final=True)[0] == [b""]
    assert GrowingFile(tmp_path / "seed.nk", 0.0, re.compile(rb"\n")).read_lines(final=True)[0] == [b"SUSECRET", b""]
