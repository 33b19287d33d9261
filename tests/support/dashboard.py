"""Run ``infrarsi dashboard`` as a user would (a subprocess of the installed CLI) and read back where it listens;
build a study's analyst DB without a server; install Debian's Chromium for the browser tests."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from infrarsi import eventlog
from infrarsi import events as ev
from infrarsi.bus import subjects
from support import apt

INFRARSI = [str(Path(sys.executable).parent / "infrarsi")]
BROWSER_PACKAGES = ["chromium", "chromium-driver"]


@contextmanager
def running_dashboard(*args: str, data_dir: Path, timeout_s: float = 60.0) -> Iterator[str]:
    """``infrarsi --data-dir DATA_DIR [args…]`` started with ``dashboard --port 0``; yields its URL, stops it after."""
    log = data_dir / f"dashboard-{time.monotonic_ns()}.log"
    data_dir.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        proc = subprocess.Popen([*INFRARSI, "--data-dir", str(data_dir), *args], stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            found = re.search(r"dashboard: (\S+)", log.read_text())
            if found:
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the dashboard did not start (exit {proc.poll()}):\n{log.read_text()}")
            time.sleep(0.1)
        yield found.group(1)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    # Stopped as a supervisor stops it (SIGTERM), with a browser's event stream possibly still open: it must
    # end promptly and cleanly.
    proc.terminate()
    try:
        code = proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"the dashboard did not stop within 20 s of SIGTERM:\n{log.read_text()}") from None
    assert code == 0, f"the dashboard exited {code} on SIGTERM:\n{log.read_text()}"
    assert "Traceback" not in log.read_text(), log.read_text()


def apply_events(db: eventlog.AnalystDB, events: list[ev.Event]) -> None:
    """Apply ``events`` to ``db`` as the replay would, each stream's messages at the next sequences."""
    by_stream: dict[str, list[eventlog.StreamMessage]] = {}
    for e in events:
        stream = subjects.route(e.type).stream
        msgs = by_stream.setdefault(stream, [])
        msgs.append((db.position(stream) + len(msgs) + 1, subjects.subject_for(e), ev.encode(e)))
    for stream, msgs in by_stream.items():
        db.apply_batch(stream, msgs)


def browser_install_reason() -> str | None:
    """Install Chromium and its driver with apt-get when missing (``make browser-deps`` does the same); ``None``
    when they are there, else why not."""
    return apt.install_reason("Chromium", BROWSER_PACKAGES, ("chromium", "chromedriver"),
                              root_hint=": run `make browser-deps` as root")
