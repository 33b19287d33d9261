"""Waking when a directory's files change (Linux inotify), instead of polling them.

Owns ``DirectoryWatch``: an inotify descriptor watching one directory for writes and new files, usable from
asyncio (``await watch.changed(timeout_s)``) or from a thread (``watch.wait(timeout_s)``). The launcher
follows a trial's probe file with it instead of polling that file every 5 ms for the launcher's clock: a
wake-up per record costs less than polling and sees a record sooner (``bench/launcher_overhead.py`` measures
both side by side; README's "launcher overhead" row has the figures). ``DirectoryWatch.open`` returns ``None`` where inotify is missing (not Linux, or no free
watches): callers then poll. ``follow`` is that loop, read on every change (or every poll) by the caller's own
reader. It must not read the files: it only says that something changed.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import os
import select
from collections.abc import Awaitable, Callable
from pathlib import Path

IN_MODIFY = 0x00000002
IN_CLOSE_WRITE = 0x00000008
IN_CREATE = 0x00000100
IN_MOVED_TO = 0x00000080
IN_NONBLOCK = os.O_NONBLOCK
IN_CLOEXEC = os.O_CLOEXEC

_libc: ctypes.CDLL | None = None


def _lib() -> ctypes.CDLL | None:
    global _libc
    if _libc is None:
        name = ctypes.util.find_library("c")
        if name is None:
            return None
        with contextlib.suppress(OSError):
            _libc = ctypes.CDLL(name, use_errno=True)
    return _libc


class DirectoryWatch:
    """Wakes on writes to, or files appearing in, one directory."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    @classmethod
    def open(cls, directory: Path) -> DirectoryWatch | None:
        libc = _lib()
        if libc is None or not hasattr(libc, "inotify_init1"):
            return None
        fd = libc.inotify_init1(IN_NONBLOCK | IN_CLOEXEC)
        if fd < 0:
            return None
        mask = IN_MODIFY | IN_CLOSE_WRITE | IN_CREATE | IN_MOVED_TO
        if libc.inotify_add_watch(fd, os.fsencode(directory), mask) < 0:
            os.close(fd)
            return None
        return cls(fd)

    def _drain(self) -> None:
        with contextlib.suppress(BlockingIOError, InterruptedError):
            while os.read(self.fd, 65536):
                pass

    def wait(self, timeout_s: float) -> bool:
        """Block until something changed (``True``) or ``timeout_s`` passed (``False``)."""
        ready, _, _ = select.select([self.fd], [], [], timeout_s)
        self._drain()
        return bool(ready)

    async def changed(self, timeout_s: float) -> bool:
        """``wait`` for asyncio: the descriptor is watched by the event loop, no thread is used."""
        loop = asyncio.get_running_loop()
        event = asyncio.Event()
        loop.add_reader(self.fd, event.set)
        try:
            await asyncio.wait_for(event.wait(), timeout_s)
            return True
        except TimeoutError:
            return False
        finally:
            loop.remove_reader(self.fd)
            self._drain()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


async def follow(
    directory: Path, read: Callable[[], Awaitable[None]], *, wake_timeout_s: float, poll_interval_s: Callable[[], float]
) -> None:
    """``await read()`` each time ``directory`` changes, until cancelled: woken by inotify where the kernel has it
    (and at least every ``wake_timeout_s``), else every ``poll_interval_s()`` seconds."""
    watch = DirectoryWatch.open(directory)
    try:
        while True:
            await read()
            if watch is not None:
                await watch.changed(wake_timeout_s)
            else:
                await asyncio.sleep(poll_interval_s())
    finally:
        if watch is not None:
            watch.close()
