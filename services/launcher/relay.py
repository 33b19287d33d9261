"""The launcher's relay of a trial's probe records onto the bus: how a job's steps reach telemetry while it runs.

A trial job holds no bus credential (docs/security.md, "Trials are untrusted"): its probe writes one JSONL file
per rank (``probe-rank<r>.jsonl`` in the trial's probe directory), and the launcher publishes each complete line
on the trial's own subject (``irsi.telemetry.<study>.<trial>``) as it appears, with the probe's own
``Nats-Msg-Id`` — the same id the end-of-trial re-publish uses, so JetStream keeps one copy of each step.

A record is relayed only when it is a ``TrialStep`` of this study and this trial (``own_step``): a job that
writes another trial's id into its file reaches no other trial's measurements. Files that are not plain files
(a symlink to a seed, a FIFO that would block the launcher) are never opened.

Must not decide anything about the trial: what a record means is telemetry's to judge.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path

from infrarsi import events as ev
from infrarsi.bus.client import BusError
from infrarsi.bus.subjects import step_msg_id
from infrarsi.runtime.logs import get_logger
from infrarsi.trial import fswatch
from nats.errors import Error as NatsError

from .output import read_regular

log = get_logger(__name__)

RELAY_WAIT_S = 0.1
"""Without inotify (or between its wake-ups), read the probe files at least this often."""

Publish = Callable[[bytes, str], Awaitable[object]]
"""Publish one probe line with its ``Nats-Msg-Id`` on the trial's own subject."""


def own_step(line: bytes, study_id: str, trial_id: str) -> ev.TrialStep | None:
    """The ``TrialStep`` ``line`` carries when it is one of this study's and trial's; ``None`` otherwise (a torn
    line, another type, another trial's id)."""
    record = ev.decode_or_none(line, (ev.TrialStep,))
    if record is None or not isinstance(record.payload, ev.TrialStep):
        return None
    if record.study_id != study_id or record.trial_id != trial_id:
        return None
    return record.payload


def probe_files(probe_dir: Path) -> list[Path]:
    """The probe's per-rank files that are plain files (not symlinks, FIFOs or devices)."""
    out = []
    for path in sorted(probe_dir.glob("probe-rank*.jsonl")) if probe_dir.is_dir() else []:
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            continue
        if stat.S_ISREG(mode):
            out.append(path)
    return out


class StepRelay:
    """Follows every rank's probe file of one trial and publishes its own steps as they are written."""

    def __init__(self, probe_dir: Path, study_id: str, trial_id: str, publish: Publish) -> None:
        self.probe_dir = probe_dir
        self.study_id = study_id
        self.trial_id = trial_id
        self.publish = publish
        self.relayed = 0
        self.refused = 0
        """Complete lines that were not this trial's steps (another trial's id, another type, garbage)."""
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, bytes] = {}

    async def poll(self) -> None:
        """Publish every complete line written since the last poll."""
        for path in probe_files(self.probe_dir):
            offset = self._offsets.get(path, 0)
            try:
                chunk = await asyncio.to_thread(read_regular, path, offset)
            except FileNotFoundError:
                continue
            if not chunk:
                continue
            self._offsets[path] = offset + len(chunk)
            data = self._partial.pop(path, b"") + chunk
            *lines, rest = data.split(b"\n")
            if rest:
                self._partial[path] = rest
            rank = path.stem.removeprefix("probe-rank")
            for line in lines:
                if not line.strip():
                    continue
                step = own_step(line, self.study_id, self.trial_id)
                if step is None:
                    self.refused += 1
                    continue
                await self.publish(line, step_msg_id(self.trial_id, rank, step.step))
                self.relayed += 1

    async def follow(self) -> None:
        """``poll`` until cancelled, woken by inotify where the kernel has it."""
        self.probe_dir.mkdir(parents=True, exist_ok=True)
        await fswatch.follow(self.probe_dir, self._poll_or_log, wake_timeout_s=RELAY_WAIT_S,
                             poll_interval_s=lambda: RELAY_WAIT_S)  # fmt: skip

    async def _poll_or_log(self) -> None:
        try:
            await self.poll()
        except (BusError, NatsError, OSError, TimeoutError) as exc:  # the trial's end re-publishes all
            log.warning("probe relay: publish failed; the trial's end re-publishes", error=str(exc)[:200])
