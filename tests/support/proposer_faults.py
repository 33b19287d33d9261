"""What the consume-loop fault tests share: a proposer process answering on a fresh server, the study it is fed,
and its status as ``ping_services`` reports it."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import msgspec
from infrarsi import events as ev
from infrarsi.bus.client import Bus
from infrarsi.runtime.stack import ping_services
from support.owned import owned_event


def study_created(study: str, payload_samples: dict[str, object], name: str) -> ev.Event:
    """A valid ``StudyCreated`` named ``name`` with a 12-trial budget, as the CLI publishes it."""
    payload = msgspec.structs.replace(
        payload_samples["StudyCreated"],  # type: ignore[arg-type]
        name=name,
        contract={"budget": {"trials": 12, "accelerator_hours": 0.5}},
    )
    return owned_event(payload, study_id=study)


async def service_status(bus: Bus, name: str) -> dict | None:
    """The status reply of the service called ``name``, or ``None`` when none answered."""
    return next((r for r in await ping_services(bus.nc, 0.2) if r["service"] == name), None)


@contextlib.asynccontextmanager
async def answering_proposer(url: str, spawn_service, wait_answering) -> AsyncIterator[tuple[Bus, object]]:
    """A test bus and a proposer process that answers status requests; the bus is closed on every path."""
    bus = await Bus.connect(url, service="test")
    try:
        proposer = spawn_service("proposer", url)
        await wait_answering(bus, proposer)
        yield bus, proposer
    finally:
        await bus.close()
