"""Launcher overhead: CPU the launcher spends watching a running trial, as a share of one core.

    python bench/launcher_overhead.py [--seconds 20] [--workers 2] [--probe-overhead] [--json]

One job runs for ``--seconds``: a parent with ``--workers`` children in their own sessions (as torchrun
starts ranks), each holding ~100 MB and computing, the parent appending a probe-like JSONL record every
``--step`` s (0.1 by default: the reference GPT's CPU steps take longer). Written here, apart from the code it measures. While it runs, three watchers sample it side by side,
each in its own thread, and each thread's CPU time is read with ``time.thread_time``:

- ``psutil_scan``: the memory watchdog as it was (psutil ``children(recursive=True)`` + ``memory_info``
  every 50 ms), kept here as the reference;
- ``watchdog``: ``procs.MemoryWatchdog`` now (``/proc/<pid>/status`` of known processes every 50 ms,
  descendants every 250 ms);
- ``probe_tail``: the launcher's probe-file follower, woken by inotify on each record (the launcher's other
  per-trial loop); ``probe_poll``: the same without inotify (polled every 1/20 of a step, 5–50 ms), the
  fallback where the kernel has no inotify.

``--probe-overhead`` also runs ``bench/probe_overhead.py`` (the probe's own cost inside the job, a step-time
ratio) so the two overheads are printed side by side. Target: watchdog + tail < 1 % of a core.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from infrarsi.trial import fswatch, procs  # noqa: E402
from infrarsi_services.launcher.service import WATCH_TIMEOUT_S, ProbeTail  # noqa: E402

JOB = textwrap.dedent(
    """
    import os, subprocess, sys, time
    seconds, workers, probe, step_s = float(sys.argv[1]), int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
    if workers:
        kids = [subprocess.Popen([sys.executable, __file__, sys.argv[1], "0", os.devnull, sys.argv[4]], start_new_session=True,
                                 env={**os.environ, "RANK": str(r)}) for r in range(workers)]
    ballast = bytearray(os.urandom(1)) * (100 << 20)
    out = open(probe, "ab", buffering=0)
    end, step, x = time.monotonic() + seconds, 0, 0
    while time.monotonic() < end:
        t0 = time.monotonic()
        while time.monotonic() - t0 < step_s:
            x = (x * 31 + 7) % 1000003
        out.write(b'{"step": %d, "x": %d}\\n' % (step, x))
        step += 1
    if workers:
        for k in kids:
            k.wait()
    """
)


class PsutilScan:
    """The watchdog before this change: the whole host's process table walked every sample."""

    def __init__(self, root: int, interval_s: float = 0.05) -> None:
        self.root = psutil.Process(root)
        self.interval_s = interval_s
        self.ranks: dict[int, str | None] = {}
        self.peak = 0

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            started = time.monotonic()
            try:
                tree = [self.root, *self.root.children(recursive=True)]
            except psutil.NoSuchProcess:
                return
            total = 0
            for proc in tree:
                try:
                    if proc.pid not in self.ranks:
                        self.ranks[proc.pid] = proc.environ().get("RANK")
                    total += proc.memory_info().rss
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
            self.peak = max(self.peak, total)
            stop.wait(max(0.0, self.interval_s - (time.monotonic() - started)))


def _timed(name: str, body, results: dict[str, float]) -> threading.Thread:
    def run() -> None:
        cpu0 = time.thread_time()
        body()
        results[name] = time.thread_time() - cpu0

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


def measure(seconds: float, workers: int, step_s: float) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        script, probe = Path(tmp) / "job.py", Path(tmp) / "probe-rank0.jsonl"
        script.write_text(JOB)
        job = subprocess.Popen([sys.executable, str(script), str(seconds), str(workers), str(probe), str(step_s)],
                               start_new_session=True)  # fmt: skip
        stop = threading.Event()
        cpu: dict[str, float] = {}
        scan = PsutilScan(job.pid)
        watchdog = procs.MemoryWatchdog([job.pid], capacity_bytes=None, untagged_rank=0)
        tail = ProbeTail(probe, time.monotonic())
        polled = ProbeTail(probe, time.monotonic())

        def poll() -> None:  # the launcher's _follow without inotify, in a thread
            while not stop.is_set():
                polled.poll()
                time.sleep(polled.interval_s())

        def follow() -> None:  # the launcher's _follow with inotify, in a thread
            watch = fswatch.DirectoryWatch.open(probe.parent)
            assert watch is not None, "no inotify here"
            while not stop.is_set():
                tail.poll()
                watch.wait(WATCH_TIMEOUT_S)
            watch.close()

        started = time.monotonic()
        threads = [_timed("psutil_scan", lambda: scan.run(stop), cpu), _timed("watchdog", watchdog.run, cpu),
                   _timed("probe_tail", follow, cpu), _timed("probe_poll", poll, cpu)]  # fmt: skip
        job.wait()
        wall = time.monotonic() - started
        stop.set()
        watchdog.stop()
        for thread in threads:
            thread.join(5.0)
    share = {name: cpu[name] / wall for name in cpu}
    return {
        "wall_s": round(wall, 2),
        "processes_watched": len(watchdog.seen),
        "records_tailed": {"probe_tail": len(tail.seen_s), "probe_poll": len(polled.seen_s)},
        "cpu_share_of_a_core": {k: round(v, 5) for k, v in share.items()},
        "launcher_now": round(share["watchdog"] + share["probe_tail"], 5),
        "launcher_before": round(share["psutil_scan"] + share["probe_poll"], 5),
        "watchdog_speedup": round(share["psutil_scan"] / share["watchdog"], 1) if share["watchdog"] > 0 else None,
        "peak_bytes": {"psutil_scan": scan.peak, "watchdog": watchdog.peak_bytes},
        "host_processes": len(psutil.pids()),
    }


def probe_overhead() -> float | None:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "probe.json"
        done = subprocess.run([sys.executable, str(ROOT / "bench" / "probe_overhead.py"), "--json", str(out)],
                              capture_output=True, text=True)  # fmt: skip
        if done.returncode != 0:
            print(done.stderr[-2000:], file=sys.stderr)
            return None
        doc = json.loads(out.read_text())
    return doc.get("overhead", doc.get("median_ratio"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--step", type=float, default=0.1, help="seconds per job step (one probe record each)")
    parser.add_argument("--probe-overhead", action="store_true", help="also run bench/probe_overhead.py")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = measure(args.seconds, args.workers, args.step)
    if args.probe_overhead:
        result["probe_overhead"] = probe_overhead()
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        share = result["cpu_share_of_a_core"]
        print(f"{result['processes_watched']} processes watched for {result['wall_s']} s "
              f"({result['host_processes']} processes on the host)")
        for name, value in share.items():
            print(f"  {name:<12} {100 * value:6.3f} % of a core")
        print(f"launcher now {100 * result['launcher_now']:.3f} %, before {100 * result['launcher_before']:.3f} % "
              f"(watchdog ×{result['watchdog_speedup']} cheaper)")
        if "probe_overhead" in result:
            print(f"probe overhead (step time ratio - 1): {result['probe_overhead']}")
    return 0 if result["launcher_now"] < 0.01 else 1


if __name__ == "__main__":
    sys.exit(main())
