"""Small services for the integration tests, each run as its own process like a real one:

    python tests/integration/helper_services.py KIND --nats-url URL --data-dir DIR

- ``crashy``: consumes ``DoctorRequested``; publishes one ``StudyFinished``, appends the published event
  id to ``$CRASHY_MARKER``, then — while ``$CRASHY_HOLD_FILE`` exists — waits before returning (and so
  before the runner acks), so that a test can SIGKILL it between publishing its output and acking
  its input. Short ``ack_wait_s``: the input is redelivered 2 s after the crash.
- ``relay``: consumes ``TrialProposed`` and publishes a ``TrialFinished`` for the same trial (under the
  launcher's name) — one hop of an event chain, for trace propagation across processes.

These are test doubles: the outputs are not what the real services compute.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import sys
from pathlib import Path

from infrarsi import events as ev
from infrarsi.runtime.service import Outbox, Service, main


class CrashyService(Service):
    name = "crashy"
    consumes = (ev.DoctorRequested,)
    ack_wait_s = 2.0

    async def handle(self, event: ev.Event, out: Outbox) -> None:
        match event.payload:
            case ev.DoctorRequested(repeats=repeats):
                published = await out.emit(ev.StudyFinished(reason="crash-test", trials=repeats, accelerator_s=0.0))
                with open(os.environ["CRASHY_MARKER"], "a") as marker:
                    marker.write(published.event_id + "\n")
                hold = Path(os.environ["CRASHY_HOLD_FILE"])
                while hold.exists():
                    await asyncio.sleep(0.05)


class RelayService(Service):
    name = "relay"
    consumes = (ev.TrialProposed,)

    async def handle(self, event: ev.Event, out: Outbox) -> None:
        match event.payload:
            case ev.TrialProposed():
                # As the launcher: consumers refuse a TrialFinished from a source the subjects table does not list.
                as_launcher = dataclasses.replace(out, source="launcher")
                await as_launcher.emit(ev.TrialFinished(status="ok", reason="relayed by a test double"))


KINDS: dict[str, type[Service]] = {"crashy": CrashyService, "relay": RelayService}

if __name__ == "__main__":
    kind = sys.argv.pop(1)
    main(KINDS[kind])
