"""Helpers (no tests): a synthetic workload (a git repo, a job without torch that writes probe records) and a
shared by the launcher and telemetry integration tests."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import textwrap
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import msgspec
import yaml
from infrarsi import events as ev
from infrarsi.bus.client import Bus
from infrarsi.bus.embedded import EmbeddedServer
from infrarsi.commands.init import prepare_study, study_created_event
from infrarsi.runtime.service import Runner
from support.owned import owned_event

JOB = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    import yaml
    from infrarsi import events as ev
    import flags
    import model

    launch = yaml.safe_load(open(sys.argv[1]))
    probe_dir = Path(sys.argv[2])
    knobs, run = launch["knobs"], launch["run"]
    if model.A and flags.B:
        raise TypeError("forward() got an unexpected keyword argument 'labels'")
    out = open(probe_dir / "probe-rank0.jsonl", "ab", buffering=0)
    chunks = []
    for i in range(run["steps"]):
        t0 = time.perf_counter()
        time.sleep(knobs["sleep"] * (4 if i < 2 else 1) * model.SLOWDOWN)
        if knobs["mode"] == "crash" and i == 3:
            raise RuntimeError("boom at step 3")
        if knobs["mode"] == "sleep":
            time.sleep(3600)
        if knobs["mode"] == "hog":
            chunks.append(os.urandom(1) * (40 << 20))
        dt = time.perf_counter() - t0
        is_eval = (i + 1) % run["eval_every"] == 0 or i == run["steps"] - 1
        if is_eval:
            time.sleep(0.05)
        step = ev.TrialStep(
            rank=0, world_size=1, step=i, loss=5.0 - 0.1 * i, step_time_s=dt, tokens=4096,
            optimizer_steps=i + 1, peak_memory_bytes=1 << 20, flops=1e9,
            eval_loss=(5.05 - 0.1 * i) if is_eval else None, eval_tokens=2048 if is_eval else None,
        )
        event = ev.make_event(step, study_id=os.environ["INFRARSI_STUDY"], trial_id=os.environ["INFRARSI_TRIAL"],
                              source="probe", event_id=ev.derived_id(os.environ["INFRARSI_TRIAL"], "0", "step", str(i)))
        out.write(ev.encode(event) + b"\\n")
    print("done", flush=True)
    """
)

MODEL = "A = False\nSLOWDOWN = 1.0\n"
FLAGS = "B = False\n"

PATCHES = {
    "faster": ("model.py", "SLOWDOWN = 1.0", "SLOWDOWN = 0.8"),
    "a-on": ("model.py", "A = False", "A = True"),
    "b-on": ("flags.py", "B = False", "B = True"),
    "slow-a": ("model.py", "SLOWDOWN = 1.0", "SLOWDOWN = 1.5"),
    "slow-b": ("model.py", "SLOWDOWN = 1.0", "SLOWDOWN = 2.0"),
}


def _diff(path: str, old: str, new: str, text: str) -> str:
    lines = text.splitlines()
    i = lines.index(old)
    body = []
    for j, line in enumerate(lines):
        if j == i:
            body += [f"-{old}", f"+{new}"]
        else:
            body.append(f" {line}")
    return f"diff --git a/{path} b/{path}\n--- a/{path}\n+++ b/{path}\n@@ -1,{len(lines)} +1,{len(lines)} @@\n" + "\n".join(body) + "\n"


ESCAPES = {
    "dotdot": "--- a/../outside.py\n+++ b/../outside.py\n@@ -0,0 +1 @@\n+x = 1\n",
    "absolute": "--- /etc/hostname\n+++ /etc/hostname\n@@ -1 +1 @@\n-a\n+b\n",
    "locked": "diff --git a/launch.yaml b/launch.yaml\n--- a/launch.yaml\n+++ b/launch.yaml\n@@ -1 +1 @@\n-knobs:\n+knobs: {}\n",
    "new-symlink": "diff --git a/evil b/evil\nnew file mode 120000\n--- /dev/null\n+++ b/evil\n@@ -0,0 +1 @@\n+/etc/passwd\n\\ No newline at end of file\n",
    "through-link": "diff --git a/link/x.py b/link/x.py\nnew file mode 100644\n--- /dev/null\n+++ b/link/x.py\n@@ -0,0 +1 @@\n+x = 1\n",
    "binary": "diff --git a/model.py b/model.py\nindex 1234567..89abcde 100644\nGIT binary patch\nliteral 3\nKcmZ>Y-~a#s0RR91\n\nliteral 0\nHcmV?d00001\n\n",
}


def make_workload(root: Path, *, timeout_s: float = 20.0, capacity: int = 1 << 30, backend: dict | None = None) -> Path:
    """A workload repo with launch.yaml (locked), *.py (editable; link/ is a symlink to /tmp), a patch library and a contract."""
    repo = root / "workload"
    (repo / "patches").mkdir(parents=True)
    (repo / "job.py").write_text(JOB)
    (repo / "model.py").write_text(MODEL)
    (repo / "flags.py").write_text(FLAGS)
    (repo / "launch.yaml").write_text(
        yaml.safe_dump({"run": {"steps": 12, "eval_every": 5}, "knobs": {"mode": "ok", "sleep": 0.1}})
    )
    (repo / "link").symlink_to("/tmp")
    index = []
    for pid, (path, old, new) in PATCHES.items():
        (repo / "patches" / f"{pid}.patch").write_text(_diff(path, old, new, FLAGS if path == "flags.py" else MODEL))
        index.append({"id": pid, "description": pid, "files": [path]})
    index[1]["conflicts_with"] = ["b-on"]
    index[2]["conflicts_with"] = ["a-on"]
    for pid, text in ESCAPES.items():
        (repo / "patches" / f"{pid}.patch").write_text(text)
        index.append({"id": pid, "description": pid})
    (repo / "patches" / "index.yaml").write_text(yaml.safe_dump({"patches": index}))
    contract = {
        "name": "synthetic",
        "goal": "test the launcher",
        "workload": {
            "repo": "workload",
            "command": ["{python}", "job.py", "{launch_file}", "{probe_dir}"],
            "launch_file": "launch.yaml",
            "steps": 12,
            "steps_key": "run.steps",
            "verify_steps": 12,
        },
        "cluster": {"id": "test-cpu", "accelerator": "cpu", "memory_capacity_bytes": capacity, "peak_flops": 1e11},
        "backend": {"kind": "local", "timeout_s": timeout_s, **(backend or {})},
        "scope": {"files": ["**/*.py"], "launch_keys": ["knobs.mode", "knobs.sleep"]},
        "search_space": {
            "knobs": {
                "knobs.mode": {"type": "choice", "choices": ["ok", "crash", "sleep", "hog"]},
                "knobs.sleep": {"type": "float", "low": 0.0, "high": 1.0},
            },
            "patches": list(PATCHES) + list(ESCAPES),
        },
        "invariants": {"loss": {"tolerance": 0.01, "at": "every_eval"}, "timing_tolerance": 0.15},
        "budget": {"trials": 10, "accelerator_hours": 1.0},
    }
    path = root / "contract.yaml"
    path.write_text(yaml.safe_dump(contract))
    return path


class Harness:
    """Services run in this event loop against a real nats-server; events are collected by trial."""

    def __init__(self, url: str, data_dir: Path) -> None:
        self.url = url
        self.data_dir = data_dir
        self.events: dict[str, dict[str, ev.Payload]] = defaultdict(dict)
        self.arrived: asyncio.Event = asyncio.Event()
        self.runners: list[tuple[Runner, asyncio.Task, Bus]] = []

    own_service = "test"
    """The service name of the harness's own connection (publishing proposals, collecting events)."""

    async def connect(self, service: str) -> Bus:
        """A connection as ``service`` (no authorization on this server)."""
        return await Bus.connect(self.url, service=service)

    async def open(self) -> None:
        self.bus = await self.connect(self.own_service)

        async def on_msg(msg) -> None:
            with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
                event = ev.decode(msg.data)
                if event.trial_id:
                    self.events[event.trial_id][event.type] = event.payload
                    self.arrived.set()

        await self.bus.nc.subscribe("irsi.*.*", cb=on_msg)

    async def serve(self, service) -> None:
        bus = await self.connect(service.name)
        runner = Runner(service, bus, grace_s=5.0)
        task = asyncio.create_task(runner.run())
        self.runners.append((runner, task, bus))

    async def close(self) -> None:
        for runner, task, bus in self.runners:
            runner.stopping.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 30)
            await bus.close()
        await self.bus.close()

    async def create_study(self, contract_path: Path) -> str:
        prepared = await asyncio.to_thread(prepare_study, contract_path, self.data_dir)
        await self.bus.publish(study_created_event(prepared))
        return prepared.study_id

    async def propose(self, study_id: str, *, knobs=None, patches=(), kind="search", steps=None, origin="manual") -> str:
        trial_id = ev.new_id()
        candidate = ev.Candidate(knobs=knobs or {}, patches=list(patches))
        proposal = ev.TrialProposed(
            candidate=candidate, candidate_key=candidate.key(), kind=kind, origin=origin, steps=steps
        )
        await self.bus.publish(owned_event(proposal, study_id=study_id, trial_id=trial_id))
        return trial_id

    async def wait_for(self, trial_id: str, event_type: str, timeout_s: float = 60.0) -> ev.Payload:
        async def wait() -> ev.Payload:
            while event_type not in self.events[trial_id]:
                self.arrived.clear()
                await self.arrived.wait()
            return self.events[trial_id][event_type]

        return await asyncio.wait_for(wait(), timeout_s)


def git_worktrees(repo: Path) -> list[str]:
    out = subprocess.run(["git", "-C", str(repo), "worktree", "list", "--porcelain"], capture_output=True, text=True).stdout
    return [line.split(" ", 1)[1] for line in out.splitlines() if line.startswith("worktree ")][1:]


@contextlib.asynccontextmanager
async def serving(tmp_path: Path, *make_services):
    """A ``Harness`` on a fresh nats-server with the services ``make(harness, url)`` builds."""
    server = EmbeddedServer.start(tmp_path / "nats")
    h = Harness(server.url, tmp_path / "data")
    await h.open()
    try:
        for make in make_services:
            await h.serve(make(h, server.url))
        yield h
    finally:
        await h.close()
        server.stop()


class LauncherProcesses:
    """Launcher processes (``python -m infrarsi_services.launcher``) that a test kills and starts again, all
    logging to one file; ``launcher_processes`` stops whichever still runs."""

    def __init__(self, url: str, data_dir: Path, log) -> None:
        self.url = url
        self.data_dir = data_dir
        self.log = log
        self.started: list[subprocess.Popen] = []

    def start(self) -> subprocess.Popen:
        env = {**os.environ, "INFRARSI_LAUNCHER_ACK_WAIT_S": "4"}
        process = subprocess.Popen(
            [sys.executable, "-m", "infrarsi_services.launcher", "--nats-url", self.url, "--data-dir", str(self.data_dir)],
            env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        self.started.append(process)
        return process


@contextlib.contextmanager
def launcher_processes(h: Harness, log_path: Path) -> Iterator[LauncherProcesses]:
    """Launcher processes serving ``h``'s server and data directory, terminated on every path."""
    with open(log_path, "ab") as log:
        lives = LauncherProcesses(h.url, h.data_dir, log)
        try:
            yield lives
        finally:
            for process in lives.started:
                if process.poll() is None:
                    process.terminate()
                    process.wait(30)


def launcher(h: Harness, url: str):
    from infrarsi_services.launcher.service import LauncherService

    return LauncherService(h.data_dir, nats_url=url)


def telemetry(h: Harness, url: str):
    from infrarsi_services.telemetry.service import TelemetryService

    return TelemetryService(complete_grace_s=5.0)


def commit_all(repo: Path) -> None:
    """``repo`` as a git repository with everything in it committed."""
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "."], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "job"], check=True)
