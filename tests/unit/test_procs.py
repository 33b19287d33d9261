"""Process trees: the memory watchdog (per-rank RSS, emulated capacity) and killing/reaping whole trees."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
from infrarsi.trial import procs

HOG = textwrap.dedent(
    """
    import os, subprocess, sys, time
    chunks = []
    if sys.argv[1] == "child-too":
        # a helper in its own session, as torchrun starts its workers
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    step = int(sys.argv[2])
    while True:
        chunks.append(bytearray(os.urandom(1)) * step)
        time.sleep(0.02)
    """
)


def start(tmp_path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    script = tmp_path / "hog.py"
    script.write_text(HOG)
    return subprocess.Popen(
        [sys.executable, str(script), *args], env={**os.environ, **(env or {})}, start_new_session=True
    )


def test_watchdog_kills_at_capacity_and_reports_the_peak(tmp_path) -> None:
    proc = start(tmp_path, "alone", str(20 << 20))
    capacity = 200 << 20
    seen = []
    watchdog = procs.MemoryWatchdog(
        [proc.pid],
        capacity_bytes=capacity,
        untagged_rank=0,
        on_exceed=lambda e: (seen.append(e), procs.kill_all(watchdog.processes(), hard=True)),
    )
    watchdog.start()
    proc.wait(timeout=30)
    watchdog.stop()
    assert proc.returncode == -9
    assert len(seen) == 1 and seen[0].rank == 0
    assert seen[0].rss_bytes > capacity
    # killed within a few samples of crossing: the peak is above capacity but not far (20 MB per 20 ms)
    assert capacity < watchdog.peak_bytes < capacity + (120 << 20)


def test_untagged_processes_are_not_counted_when_they_are_machinery(tmp_path) -> None:
    proc = start(tmp_path, "alone", str(1 << 20))
    watchdog = procs.MemoryWatchdog([proc.pid], capacity_bytes=None, untagged_rank=None)
    try:
        assert watchdog.sample() == {}
    finally:
        procs.kill_all([psutil.Process(proc.pid)], hard=True)
        proc.wait()


def test_rank_from_environment(tmp_path) -> None:
    proc = start(tmp_path, "alone", str(1 << 20), env={"RANK": "3"})
    watchdog = procs.MemoryWatchdog([proc.pid], capacity_bytes=None, untagged_rank=None)
    try:
        time.sleep(0.2)
        assert set(watchdog.sample()) == {3}
    finally:
        procs.kill_all([psutil.Process(proc.pid)], hard=True)
        proc.wait()


def test_tagged_processes_are_found_and_killed_even_in_their_own_session(tmp_path) -> None:
    tag = f"{tmp_path}|trial-1"
    proc = start(tmp_path, "child-too", str(1 << 16), env={procs.LAUNCH_TAG_VAR: tag})
    deadline = time.monotonic() + 10
    while len(procs.tagged_processes(f"{tmp_path}|")) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    found = procs.tagged_processes(f"{tmp_path}|")
    assert len(found) == 2
    assert procs.tagged_processes(f"{tmp_path}-other|") == []
    procs.kill_all(found, grace_s=1.0)
    proc.wait(timeout=5)
    assert procs.tagged_processes(f"{tmp_path}|") == []


def test_procref_survives_pid_reuse() -> None:
    me = procs.ProcRef.of(psutil.Process())
    assert me.process() is not None
    assert procs.ProcRef(me.pid, me.create_time - 100).process() is None


@pytest.mark.parametrize("hard", [True, False])
def test_kill_all_ends_a_process_that_ignores_sigterm(tmp_path, hard: bool) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(600)"],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    proc.stdout.readline()
    started = time.monotonic()
    procs.kill_all([psutil.Process(proc.pid)], grace_s=0.5, hard=hard)
    assert proc.wait(timeout=5) == -9
    assert time.monotonic() - started < 4


SPIKE = textwrap.dedent(
    """
    import os, sys, time
    spike = bytearray(os.urandom(1)) * (300 << 20)  # every page written: resident
    del spike
    open(sys.argv[1], "w").close()  # the spike is over
    time.sleep(600)
    """
)


def test_a_spike_between_two_samples_is_still_an_oom(tmp_path) -> None:
    script, over = tmp_path / "spike.py", tmp_path / "over"
    script.write_text(SPIKE)
    proc = subprocess.Popen([sys.executable, str(script), str(over)], start_new_session=True)
    try:
        deadline = time.monotonic() + 20
        while not over.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert over.exists()
        # The first sample comes after the spike: only the kernel's high-water mark still knows it.
        seen = []
        watchdog = procs.MemoryWatchdog([proc.pid], capacity_bytes=200 << 20, untagged_rank=0, on_exceed=seen.append)
        now = watchdog.sample()
        assert now[0] < 200 << 20, "the spike was gone when the watchdog first looked"
        assert watchdog.peak_per_rank[0] > 300 << 20
        watchdog.start()
        deadline = time.monotonic() + 5
        while not seen and time.monotonic() < deadline:
            time.sleep(0.05)
        assert seen and seen[0].rss_bytes > 300 << 20 and seen[0].rank == 0
        watchdog.stop()
    finally:
        procs.kill_all([psutil.Process(proc.pid)], hard=True)
        proc.wait()
