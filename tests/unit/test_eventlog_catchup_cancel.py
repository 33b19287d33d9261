"""A catch-up cancelled while it waits for its stream reader to wind down ends cancelled: the cancel is not
swallowed. (Before, a stopping reporter could wait forever for a catch-up that went on: the CI hang of
``tests/integration/test_bank_wiring.py::test_a_finished_study_seeds_the_next_init_through_the_reporter``.)

The timing is arranged with stand-ins (an empty stream, a queue whose producer is slow to wind down): the
window is one event-loop turn in a real catch-up, too short to hit on purpose with a real bus."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from infrarsi.eventlog import catchup


class _SlowToStopQueue(asyncio.Queue[Any]):
    """After the end-of-stream sentinel the producer lingers, and takes 0.3 s to finish once cancelled."""

    async def put(self, item: Any) -> None:
        self.put_nowait(item)
        if item is None:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                await asyncio.sleep(0.3)
                raise


class _Positions:
    def position(self, stream: str) -> int:
        return 0


async def _empty_stream(bus: object, stream: str, start: int) -> AsyncIterator[list[Any]]:
    for chunk in ():
        yield chunk


def test_a_cancel_that_arrives_while_the_reader_winds_down_is_not_swallowed(monkeypatch) -> None:
    monkeypatch.setattr(catchup.asyncio, "Queue", _SlowToStopQueue)
    monkeypatch.setattr(catchup, "read_stream", _empty_stream)

    async def scenario() -> None:
        task = asyncio.create_task(catchup._catch_up_stream(
            None, _Positions(), "EVENTS", None, 10, catchup._Applied(0, None)))  # stand-ins: no bus, no writer
        await asyncio.sleep(0.1)  # the stream ended; the catch-up waits for the reader's teardown
        assert not task.done()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(scenario())
