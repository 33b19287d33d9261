"""The local backend's trial sandbox (``infrarsi.trial.sandbox``, bubblewrap), from inside real jobs: what a sandboxed
rank can see, write and reach, for every rank layout; ``isolation: sandbox`` refused where bwrap is missing and
``auto`` then said to be unisolated; a read-only input that would expose the launcher's state refused. The same
from a Slurm node's side (``slurm_node`` run as ``srun`` runs it, from the backend's ``node-job.json``).
The jobs are tiny Python scripts (no torch in the ranks)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from infrarsi.backends import JobSpec, LocalBackend, SubmitError
from infrarsi.backends.slurm import SlurmBackend, node_job
from infrarsi.backends.slurm_node import SANDBOX_REFUSED
from infrarsi.trial import sandbox
from support.backend_jobs import run_to_end

pytestmark = pytest.mark.integration

PROBE = textwrap.dedent(
    """
    import json, os, socket, sys
    from pathlib import Path
    rank = int(os.environ.get("RANK", "0"))
    state, launch, port = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    def attempt(action):
        try:
            action()
            return "ok"
        except OSError as exc:
            return type(exc).__name__
    seen = {
        "write_workdir": attempt(lambda: Path(f"out{rank}.txt").write_text("x")),
        "write_probe_dir": attempt(lambda: (Path(os.environ["PROBE_DIR"]) / f"r{rank}").write_text("x")),
        "read_launch": attempt(lambda: launch.read_text()),
        "write_launch": attempt(lambda: launch.write_text("x")),
        "state_listing": sorted(os.listdir(state)) if state.exists() else None,
        "job_listing": sorted(os.listdir(state / "job")) if (state / "job").exists() else None,
        "shadow_visible": Path("/etc/shadow").exists(),
        "write_root": attempt(lambda: Path(os.environ.get("ROOT_TARGET", "/evil-irsi-sandbox")).write_text("x")),
        "tmp_private": not Path(os.environ["HOST_TMP_MARKER"]).exists(),
        "home": os.environ.get("HOME"),
        "pids": sum(1 for p in os.listdir("/proc") if p.isdigit()),
        "host_port": attempt(lambda: socket.create_connection(("127.0.0.1", port), timeout=2).close()),
    }
    print("SEEN " + json.dumps(seen), flush=True)
    """
)


def layouts() -> list[tuple[str, str, int, int]]:
    return [("python", "python", 1, 1), ("torchrun-1x2", "torchrun", 1, 2), ("torchrun-2x1", "torchrun", 2, 1)]


@pytest.fixture
def host_listener():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    yield sock.getsockname()[1]
    sock.close()


def sandboxed_spec(tmp_path: Path, launcher: str, nnodes: int, nproc: int, port: int, **extra) -> JobSpec:
    work, state = tmp_path / "work", tmp_path / "state"
    work.mkdir(exist_ok=True)
    (work / "job.py").write_text(PROBE)
    launch = tmp_path / "inputs" / "launch.yaml"
    launch.parent.mkdir(exist_ok=True)
    launch.write_text("knobs: {}\n")
    probe_dir = state / "job" / "probe"
    probe_dir.mkdir(parents=True, exist_ok=True)
    marker = tmp_path / "host-tmp-marker"
    marker.write_text("on the host")
    env = {**os.environ, "PROBE_DIR": str(probe_dir), "HOST_TMP_MARKER": str(marker)}
    return JobSpec(
        name="job", argv=[sys.executable, str(work / "job.py"), str(state), str(launch), str(port)], workdir=work,
        env=env, state_dir=state / "job", launcher=launcher, nnodes=nnodes, nproc_per_node=nproc,  # type: ignore[arg-type]
        isolation="sandbox", read_only=[str(launch)], writable=[str(probe_dir)], **extra,
    )  # fmt: skip


@pytest.mark.parametrize(("case", "launcher", "nnodes", "nproc"), layouts(), ids=[c[0] for c in layouts()])
def test_a_sandboxed_rank_sees_only_its_binds(tmp_path, sandbox_ready, host_listener, case, launcher, nnodes,
                                              nproc) -> None:  # fmt: skip
    if sandbox_ready is not None:
        pytest.skip(f"no sandbox: {sandbox_ready}")
    backend = LocalBackend(str(tmp_path / "state"))
    spec = sandboxed_spec(tmp_path, launcher, nnodes, nproc, host_listener)
    handle = backend.submit(spec)
    assert handle.isolation == "bwrap"
    assert handle.command[0] != sandbox.bwrap_path()  # shown as the job's own command
    result = run_to_end(backend, handle)
    assert result.exit_code == 0, result.output_tail
    seen = [json.loads(line.split("SEEN ", 1)[1]) for line in result.output_tail.splitlines() if "SEEN " in line]
    assert len(seen) == nnodes * nproc, result.output_tail
    for rank in seen:
        assert rank["write_workdir"] == rank["write_probe_dir"] == rank["read_launch"] == "ok", rank
        assert rank["write_launch"] != "ok" and rank["write_root"] != "ok", rank  # read-only bind, read-only root
        # of the launcher's state only the path to its own probe directory (bwrap's mount points), nothing else
        assert rank["state_listing"] == ["job"] and rank["job_listing"] == ["probe"], rank
        assert not rank["shadow_visible"] and rank["tmp_private"], rank
        assert rank["home"] == "/tmp"
        assert rank["pids"] < 10, rank  # its own PID namespace: no other process's /proc
        # one node: no network but its own loopback; the agents of several nodes keep the host's
        assert (rank["host_port"] == "ok") == (nnodes > 1), rank
    assert sorted(p.name for p in (tmp_path / "work").glob("out*.txt")) == [f"out{r}.txt" for r in range(nnodes * nproc)]
    assert not Path("/evil-irsi-sandbox").exists()


def test_sandbox_asked_but_missing_is_refused_and_auto_runs_unisolated(tmp_path, host_listener, monkeypatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))  # no bwrap on this PATH
    sandbox.unavailable_reason.cache_clear()
    try:
        backend = LocalBackend(str(tmp_path / "state"))
        spec = sandboxed_spec(tmp_path, "python", 1, 1, host_listener)
        with pytest.raises(SubmitError, match=r"isolation: sandbox, but bubblewrap \(`bwrap`\) is not installed"):
            backend.submit(spec)
        unisolated_env = {**spec.env, "ROOT_TARGET": str(tmp_path / "evil")}  # it would write there for real
        handle = backend.submit(JobSpec(**{**spec.__dict__, "isolation": "auto", "env": unisolated_env}))
        assert handle.isolation == "none"
        result = run_to_end(backend, handle)
        assert result.exit_code == 0 and '"node0.log"' in result.output_tail, result.output_tail
    finally:
        sandbox.unavailable_reason.cache_clear()


def test_an_input_holding_the_launchers_state_is_refused(tmp_path, sandbox_ready, host_listener) -> None:
    if sandbox_ready is not None:
        pytest.skip(f"no sandbox: {sandbox_ready}")
    backend = LocalBackend(str(tmp_path / "state"))
    spec = sandboxed_spec(tmp_path, "python", 1, 1, host_listener)
    leaky = JobSpec(**{**spec.__dict__, "read_only": [str(tmp_path)]})
    with pytest.raises(SubmitError, match=f"read-only input {tmp_path} contains {tmp_path / 'state'}"):
        backend.submit(leaky)
    hidden = JobSpec(**{**spec.__dict__, "hidden": [str(tmp_path / "work" / "secrets")]})
    with pytest.raises(SubmitError, match=f"writable directory {tmp_path / 'work'} contains"):
        backend.submit(hidden)


def run_slurm_node(job_file: Path, path: str) -> subprocess.CompletedProcess[str]:
    """``slurm_node`` as ``srun`` starts it on node ``irsi-n9`` (its environment's ``PATH`` is ``path``)."""
    env = {**os.environ, "SLURM_NODEID": "0", "SLURMD_NODENAME": "irsi-n9", "SLURM_JOB_ID": "7", "PATH": path}
    return subprocess.run([sys.executable, "-m", "infrarsi.backends.slurm_node", str(job_file)], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip


@pytest.mark.parametrize(("launcher", "nproc"), [("python", 1), ("torchrun", 2)])
def test_a_slurm_node_starts_the_job_in_the_sandbox_or_refuses_it(tmp_path, sandbox_ready, host_listener, launcher,
                                                                  nproc) -> None:  # fmt: skip
    """The node job the Slurm backend writes for a sandboxed one-node trial: the node runs it inside the sandbox
    (it sees only its binds, no network; torchrun's rendezvous on the sandbox's loopback); a node without bwrap
    refuses it, saying why, and nothing of the job runs."""
    if sandbox_ready is not None:
        pytest.skip(f"no sandbox: {sandbox_ready}")
    spec = sandboxed_spec(tmp_path, launcher, 1, nproc, host_listener)
    job_file = spec.state_dir / "node-job.json"
    job_file.write_text(json.dumps(node_job(spec, sandbox.SANDBOXED, str(tmp_path / "state"))))
    log = spec.state_dir / "node0.log"
    done = run_slurm_node(job_file, os.environ["PATH"])
    assert done.returncode == 0, (done.stderr, log.read_text())
    seen = [json.loads(line.split("SEEN ", 1)[1]) for line in log.read_text().splitlines() if "SEEN " in line]
    assert len(seen) == nproc, log.read_text()
    for rank in seen:
        assert rank["write_workdir"] == rank["write_probe_dir"] == rank["read_launch"] == "ok", rank
        assert rank["write_launch"] != "ok" and rank["write_root"] != "ok", rank
        assert rank["state_listing"] == ["job"] and rank["job_listing"] == ["probe"], rank  # not node-job.json
        assert rank["tmp_private"] and rank["pids"] < 10 and rank["host_port"] != "ok", rank
    log.unlink()
    done = run_slurm_node(job_file, str(tmp_path / "empty-bin"))  # a node without bwrap
    assert done.returncode == SANDBOX_REFUSED
    refusal = "isolation: sandbox, refused on node irsi-n9: bubblewrap (`bwrap`) is not installed"
    assert refusal in log.read_text() and refusal in (spec.state_dir / "refused-node0.txt").read_text()
    assert "SEEN" not in log.read_text()


def test_a_slurm_trial_with_an_input_holding_the_data_directory_is_refused_before_sbatch(tmp_path) -> None:
    backend = SlurmBackend(str(tmp_path / "data" / "launcher" / "trials"))
    spec = JobSpec(name="t1", argv=[sys.executable, "job.py"], workdir=tmp_path / "data" / "t1" / "worktree", env={},
                   state_dir=tmp_path / "data" / "t1", isolation="sandbox", read_only=[str(tmp_path)],
                   hidden=[str(tmp_path / "data")])  # fmt: skip
    with pytest.raises(SubmitError, match=f"read-only input {tmp_path} contains"):
        backend.submit(spec)
    assert not (spec.state_dir / "node-job.json").exists()


def test_an_installed_tool_in_its_own_virtual_environment_runs_sandboxed(tmp_path, sandbox_ready) -> None:
    """A command that names a tool by its path in a virtual environment of its own (``.venv-litgpt/bin/litgpt``):
    the sandbox shows the job that environment and the Python it was made from, read-only."""
    if sandbox_ready is not None:
        pytest.skip(f"no sandbox: {sandbox_ready}")
    import venv

    tools = tmp_path / "tools" / ".venv-tool"
    venv.EnvBuilder(with_pip=False).create(tools)
    tool = tools / "bin" / "tool"
    tool.write_text(f"#!{tools / 'bin' / 'python'}\nimport pathlib, sys\nprint('TOOL', sys.prefix)\n"
                    "pathlib.Path(sys.prefix, 'x').write_text('x')\n")  # fmt: skip
    tool.chmod(0o755)
    assert sandbox.program_inputs([str(tool), "pretrain"])[0] == tools
    work = tmp_path / "work"
    work.mkdir()
    backend = LocalBackend(str(tmp_path / "state"))
    handle = backend.submit(JobSpec(name="job", argv=[str(tool), "pretrain"], workdir=work, env=dict(os.environ),
                                    state_dir=tmp_path / "state" / "job", isolation="sandbox"))  # fmt: skip
    assert handle.isolation == "bwrap"
    result = run_to_end(backend, handle)
    assert f"TOOL {tools}" in result.output_tail, result.output_tail
    assert "Read-only file system" in result.output_tail and not (tools / "x").exists()  # seen, never written
