"""Where probe records go: a JSONL file (always) and NATS JetStream (when configured).

The JSONL file is the record of truth: one ``Event`` envelope per line, line-buffered, so a job killed with
SIGKILL leaves every step it finished on disk; the launcher re-publishes from it (dedup by ``Nats-Msg-Id``).
The NATS publisher runs its own asyncio loop in a daemon thread; the training thread only hands it bytes
(``call_soon_threadsafe``), so publishing never blocks a step, and a failure is logged, never raised.
This module must not import torch.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path

from infrarsi.bus.subjects import PROBE

log = logging.getLogger("infrarsi.probe")


class JsonlSink:
    """Append one encoded event per line; each line reaches the OS before ``write`` returns."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = open(path, "ab", buffering=0)  # unbuffered: one write(2) per record

    def write(self, line: bytes) -> None:
        self._file.write(line + b"\n")

    def close(self) -> None:
        self._file.close()


class NatsPublisher:
    """Batched JetStream publishes from a background thread with its own event loop."""

    def __init__(
        self, url: str, *, nkey_file: str | None = None, max_batch: int = 64, connect_timeout_s: float = 2.0
    ) -> None:
        self.url = url
        self.nkey_file = nkey_file
        """The probe's seed file on a server with authorization (``$INFRARSI_NKEY_FILE``, set by the launcher)."""
        self.max_batch = max_batch
        self.connect_timeout_s = connect_timeout_s
        self.published = 0
        self.failed = 0
        self._loop = asyncio.new_event_loop()
        self._queue: asyncio.Queue[tuple[str, bytes, dict[str, str]] | None] | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="infrarsi-probe-nats", daemon=True)
        self._thread.start()
        self._ready.wait(timeout=5.0)

    def publish(self, subject: str, data: bytes, headers: dict[str, str]) -> None:
        """Queue one message; returns at once."""
        if self._queue is None or self._loop.is_closed():
            return
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, (subject, data, headers))
        except RuntimeError:  # loop already closed by a failed connect
            pass

    def close(self, timeout_s: float = 5.0) -> None:
        """Flush what is queued (up to ``timeout_s``) and stop the thread."""
        if self._queue is not None and not self._loop.is_closed():
            try:
                self._loop.call_soon_threadsafe(self._queue.put_nowait, None)
            except RuntimeError:
                pass
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            log.warning("probe: NATS publisher did not flush within %.1fs; the JSONL file has every step", timeout_s)

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._queue = asyncio.Queue()
        self._ready.set()
        try:
            self._loop.run_until_complete(self._main())
        except Exception:  # never let the thread's death reach training; JSONL is the record of truth
            log.exception("probe: NATS publisher stopped")
        finally:
            self._loop.close()

    async def _main(self) -> None:
        assert self._queue is not None
        try:
            import nats  # deferred: a job without nats-py still trains and writes JSONL

            async def on_error(exc: Exception) -> None:  # nats-py prints tracebacks by default
                log.debug("probe: NATS client error: %s", exc)

            from infrarsi.bus.credentials import Credentials

            creds = Credentials(PROBE, Path(self.nkey_file)).connect_options() if self.nkey_file else {}
            nc = await nats.connect(
                self.url,
                **creds,
                connect_timeout=self.connect_timeout_s,
                max_reconnect_attempts=3,
                reconnect_time_wait=0.5,
                allow_reconnect=True,
                error_cb=on_error,
            )
            js = nc.jetstream()
        except Exception as exc:
            log.warning("probe: cannot connect to NATS at %s (%s); steps go to JSONL only", self.url, exc)
            while await self._queue.get() is not None:
                pass
            return
        try:
            done = False
            while not done:
                batch = [await self._queue.get()]
                while len(batch) < self.max_batch and not self._queue.empty():
                    batch.append(self._queue.get_nowait())
                if batch[-1] is None:
                    done = True
                messages = [m for m in batch if m is not None]
                results = await asyncio.gather(
                    *(js.publish(subject, data, headers=headers) for subject, data, headers in messages),
                    return_exceptions=True,
                )
                for (_, _, headers), result in zip(messages, results, strict=True):
                    if isinstance(result, BaseException):
                        self.failed += 1
                        log.warning("probe: publish %s failed: %s", headers.get("Nats-Msg-Id"), result)
                    else:
                        self.published += 1
        finally:
            try:
                await nc.drain()
            except Exception as exc:
                log.warning("probe: NATS drain failed: %s", exc)
