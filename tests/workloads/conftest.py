"""Helpers for running the reference GPT workload as a user (or the launcher) would: a subprocess per run,
in a scratch copy when patches are applied, results read back from the probe's JSONL files."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from infrarsi import events
from infrarsi.probe import read_records

REPO = Path(__file__).resolve().parents[2]
WORKLOAD = REPO / "workloads" / "gpt"

TINY = {
    "model.vocab_size": 128,
    "model.seq_len": 32,
    "model.n_layer": 2,
    "model.n_head": 4,
    "model.d_model": 64,
    "model.mlp_hidden": 256,
    "model.expert_hidden": 128,
    "run.steps": 16,
    "run.global_batch_size": 8,
    "run.warmup_steps": 2,
    "run.eval_every": 4,
    "run.eval_batch_size": 4,
    "knobs.micro_batch_size": 2,
    "knobs.intra_op_threads": 1,
}
"""Overrides that make any of the four launch files train in about a second on one core."""


@dataclass
class Run:
    returncode: int
    output: str
    records: dict[int, list[events.TrialStep]]

    @property
    def rank0(self) -> list[events.TrialStep]:
        return self.records[0]

    def losses(self, rank: int = 0) -> list[float]:
        return [r.loss for r in self.records[rank]]

    def eval_losses(self, rank: int = 0) -> list[tuple[int, float]]:
        return [(r.step, r.eval_loss) for r in self.records[rank] if r.eval_loss is not None]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def workload_copy(tmp: Path, patches: list[str] = ()) -> Path:
    """A scratch copy of the workload (not a git repo) with ``patches`` applied by ``git apply``."""
    dest = tmp / "workload"
    shutil.copytree(WORKLOAD, dest, ignore=shutil.ignore_patterns("__pycache__", ".infrarsi"))
    for patch_id in patches:
        subprocess.run(["git", "apply", str(WORKLOAD / "patches" / f"{patch_id}.diff")], cwd=dest, check=True)
    return dest


TEARDOWN_ABORT = "terminate called without an active exception"
"""What a rank prints when gloo's teardown aborts it (std::terminate on a joinable thread) after its last step."""

AGENT_GRACE_S = 20.0
"""Once one torchrun agent has failed, how long the others get to exit before they are killed: a failed peer
leaves them in torchrun's exit barrier (300 s), which is a hang, not information."""


def _run_agents(tmp: Path, workdir: Path, nnodes: int, nproc: int, script: list[str], env: dict[str, str],
                timeout: float) -> tuple[int, str]:
    """``nnodes`` torchrun agents on one host with a loopback c10d rendezvous: (worst exit code, their logs)."""
    port = free_port()
    # Each agent writes to its own file: with pipes read one after the other, a chatty second agent
    # fills its pipe, blocks, and the first waits for it forever inside a collective.
    logs = [tmp / f"agent{node}.log" for node in range(nnodes)]
    procs = []
    for node, log_path in enumerate(logs):
        with open(log_path, "w") as log:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nnodes), "--nproc-per-node",
                 str(nproc), "--node-rank", str(node), "--rdzv-backend", "c10d", "--rdzv-endpoint",
                 f"127.0.0.1:{port}", "--rdzv-id", f"test-{port}", *script],
                cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
            ))  # fmt: skip
    deadline = time.monotonic() + timeout
    try:
        while any(p.poll() is None for p in procs) and time.monotonic() < deadline:
            if any(p.returncode not in (None, 0) for p in procs):
                deadline = min(deadline, time.monotonic() + AGENT_GRACE_S)
            time.sleep(0.2)
    finally:
        killed = [node for node, p in enumerate(procs) if p.poll() is None]
        for node in killed:
            procs[node].kill()
            procs[node].wait()
    output = "\n".join(path.read_text() for path in logs)
    if killed:
        output += f"\n[run_workload] killed agent(s) {killed}: still running {timeout:g} s after launch or " \
                  f"{AGENT_GRACE_S:g} s after a peer failed"
    return max(abs(p.returncode) for p in procs), output


def _all_steps_recorded(probe_dir: Path, ranks: int, steps: int) -> bool:
    """Whether each of the ``ranks`` probe files holds steps 0 … ``steps`` − 1, in order."""
    files = sorted(probe_dir.glob("probe-rank*.jsonl"))
    return len(files) == ranks and all([r.step for r in read_records(path)] == list(range(steps)) for path in files)


def run_workload(
    tmp: Path,
    launch: str,
    overrides: dict[str, object] | None = None,
    *,
    patches: list[str] = (),
    nproc: int = 1,
    nnodes: int = 1,
    timeout: float = 180,
    check: bool = True,
    env: dict[str, str] | None = None,
) -> Run:
    """Run train.py plainly (nproc=nnodes=1), under torchrun (nproc>1), or as ``nnodes`` torchrun agents
    on one host with a loopback c10d rendezvous."""
    workdir = workload_copy(tmp, patches) if patches else WORKLOAD
    probe_dir = tmp / "probe"
    args = ["--launch-file", str(workdir / "launch" / f"{launch}.yaml")]
    settings = {**TINY, **(overrides or {})}
    for key, value in settings.items():
        args += ["--set", f"{key}={value}"]
    extra = env or {}
    env = {**os.environ, "INFRARSI_PROBE_DIR": str(probe_dir), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    for var in ("INFRARSI_NATS_URL", "INFRARSI_TRIAL", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(var, None)
    env.update(extra)
    train = str(workdir / "train.py")
    if nnodes > 1:
        returncode, output = _run_agents(tmp, workdir, nnodes, nproc, [train, *args], env, timeout)
        steps = int(str(settings["run.steps"]))
        if returncode != 0 and TEARDOWN_ABORT in output and _all_steps_recorded(probe_dir, nnodes * nproc, steps):
            # torch's gloo teardown, not the workload: every rank recorded every step, then one aborted on exit
            # (about 1 run in 40 of two agents on a 2-core host, torch 2.13). Once more, from a clean probe dir.
            shutil.rmtree(probe_dir)
            returncode, output = _run_agents(tmp, workdir, nnodes, nproc, [train, *args], env, timeout)
    else:
        cmd = [sys.executable, train, *args]
        if nproc > 1:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
                   "--master-port", str(free_port()), train, *args]  # fmt: skip
        proc = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)
        returncode, output = proc.returncode, proc.stdout + proc.stderr
    if check and returncode != 0:
        pytest.fail(f"workload exited {returncode}:\n{output[-4000:]}")
    records = {}
    for path in sorted(probe_dir.glob("probe-rank*.jsonl")):
        rank = int(path.stem.removeprefix("probe-rank"))
        records[rank] = read_records(path)
    return Run(returncode, output, records)


def rel_diff(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b), (len(a), len(b))
    return max(abs(x - y) / abs(y) for x, y in zip(a, b, strict=True))
