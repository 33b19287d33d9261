"""The launcher-backend contract (``infrarsi.backends.base``), run against every backend.

Optuna's ``tests/storages_tests`` is the model: one suite, parametrised over implementations, checks what the
launcher relies on — the calling order (open → reap → submit/poll/collect, cancel at any time, close), that a
finished job stays finished, that ``cancel`` is idempotent and its first reason stands, that several jobs run
at once, that ``close`` ends what still runs, and that nothing of a job is left after ``collect``.

To add a backend, write a ``BackendUnderTest`` (how to build it, a job that succeeds / fails / runs long, and
what of a job could be left running) and append it to ``IMPLEMENTATIONS``. A backend that needs something this
host lacks (a Slurm controller, a Kubernetes API) skips itself in ``make`` with the reason. ``kubernetes`` runs
against the Kubernetes API server of ``tests/support/kube_api.py`` (a real HTTP server playing each job's story:
no cluster can run here), so it checks the backend's side of the contract, not a cluster's.
"""

from __future__ import annotations

import contextlib
import os
import sys
import textwrap
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import pytest
import yaml
from infrarsi.backends import Backend, JobHandle, JobSpec, LocalBackend
from infrarsi.backends.sim import SimBackend
from infrarsi.trial import procs
from support.backend_jobs import run_to_end

Behaviour = Literal["ok", "fail", "long"]


class BackendUnderTest(ABC):
    """One implementation under the contract suite."""

    id: str

    @abstractmethod
    def make(self, state: Path) -> Backend:
        """A fresh backend owning ``state`` (not opened yet)."""

    @abstractmethod
    def job(self, tmp: Path, behaviour: Behaviour, name: str) -> JobSpec:
        """A job that exits 0 quickly, fails with a non-zero code and a reason in its output, or runs for minutes."""

    def leftovers(self, state: Path) -> list[object]:
        """What of this owner's jobs still runs (processes, cluster jobs); empty after every ``collect``."""
        return []

    @contextlib.contextmanager
    def serving(self, tmp: Path) -> Iterator[None]:
        """What the backend talks to, for one test (default: nothing)."""
        yield


class LocalUnderTest(BackendUnderTest):
    id = "local"
    SCRIPT = textwrap.dedent(
        """
        import sys, time
        mode = sys.argv[1]
        print(f"job mode {mode}", flush=True)
        if mode == "fail":
            print("Traceback: boom", flush=True)
            sys.exit(3)
        if mode == "long":
            time.sleep(600)
        """
    )

    def make(self, state: Path) -> Backend:
        return LocalBackend(str(state))

    def job(self, tmp: Path, behaviour: Behaviour, name: str) -> JobSpec:
        script = tmp / "job.py"
        script.write_text(self.SCRIPT)
        return JobSpec(name=name, argv=[sys.executable, str(script), behaviour], workdir=tmp, env=dict(os.environ),
                       state_dir=tmp / "state" / name)

    def leftovers(self, state: Path) -> list[object]:
        return list(procs.tagged_processes(f"{state}|"))


class SimUnderTest(BackendUnderTest):
    """The simulator: jobs are threads; a launch file the scenario rejects is its crash."""

    id = "sim"
    SCENARIO = "dense7b_h100x64"

    def make(self, state: Path) -> Backend:
        return SimBackend(str(state), scenario=self.SCENARIO, step_s=0.01, publish=False)

    def job(self, tmp: Path, behaviour: Behaviour, name: str) -> JobSpec:
        launch = {"steps": 3000 if behaviour == "long" else 3}
        if behaviour == "fail":
            launch["recompute"] = False  # not one of the scenario's choices: the simulated job crashes
        path = tmp / f"{name}-launch.yaml"
        path.write_text(yaml.safe_dump(launch))
        return JobSpec(name=name, argv=["--scenario", self.SCENARIO, "--launch", str(path)], workdir=tmp, env={},
                       state_dir=tmp / "state" / name)


class KubernetesUnderTest(BackendUnderTest):
    """A PyTorchJob per job, against the scripted Kubernetes API server; each job's story follows its behaviour."""

    id = "kubernetes"

    @contextlib.contextmanager
    def serving(self, tmp: Path) -> Iterator[None]:
        pytest.importorskip("kubernetes", reason="the kubernetes extra is not installed")
        from support.kube_api import Cluster, kube_api

        self.cluster = Cluster()
        with kube_api(self.cluster, tmp) as kubeconfig:
            self.kubeconfig = kubeconfig
            yield

    def make(self, state: Path) -> Backend:
        from infrarsi.backends.kubernetes import KubernetesBackend
        from infrarsi.study.contract import BackendSpec

        options = BackendSpec(kind="kubernetes", namespace="ml", image="registry.example/train:1",
                              kubeconfig=str(self.kubeconfig))  # fmt: skip
        return KubernetesBackend(str(state), options)

    def job(self, tmp: Path, behaviour: Behaviour, name: str) -> JobSpec:
        from infrarsi.backends.kubernetes_manifests import label_value
        from support.kube_api import PodEnd, Story

        self.cluster.stories[label_value(name)] = {
            "ok": Story(ends=[PodEnd(log="job mode ok\n")]),
            "fail": Story(ends=[PodEnd(exit_code=3, reason="Error", log="job mode fail\nTraceback: boom\n")]),
            "long": Story(ends=None),
        }[behaviour]
        return JobSpec(name=name, argv=[sys.executable, "job.py", behaviour], workdir=tmp, env={},
                       state_dir=tmp / "state" / name)  # fmt: skip

    def leftovers(self, state: Path) -> list[object]:
        return [o["metadata"]["name"] for r in ("pytorchjobs", "jobs", "services", "pods") for o in self.cluster.live(r)]


IMPLEMENTATIONS: list[BackendUnderTest] = [LocalUnderTest(), SimUnderTest(), KubernetesUnderTest()]


@pytest.fixture(params=IMPLEMENTATIONS, ids=lambda b: b.id)
def under_test(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BackendUnderTest]:
    with request.param.serving(tmp_path):
        yield request.param


@pytest.fixture
def backend(under_test: BackendUnderTest, tmp_path: Path):
    b = under_test.make(tmp_path / "state")
    b.open()
    assert b.reap() == 0, "a fresh owner has nothing to reap"
    yield b
    b.close()


def wait_running(backend: Backend, handle: JobHandle, seconds: float = 0.5) -> None:
    time.sleep(seconds)
    assert not backend.poll(handle), "a long job must still be running"


def test_a_job_that_succeeds(backend: Backend, under_test: BackendUnderTest, tmp_path: Path) -> None:
    handle = backend.submit(under_test.job(tmp_path, "ok", "ok1"))
    assert handle.spec.name == "ok1" and handle.command
    result = run_to_end(backend, handle)
    assert result.exit_code == 0, result.output_tail
    assert result.cancelled is None and not result.oom and result.wall_s > 0
    assert under_test.leftovers(tmp_path / "state") == []


def test_a_job_that_fails_says_why(backend: Backend, under_test: BackendUnderTest, tmp_path: Path) -> None:
    result = run_to_end(backend, backend.submit(under_test.job(tmp_path, "fail", "fail1")))
    assert result.exit_code not in (0, None)
    assert result.output_tail.strip(), "the output's tail carries the reason"
    assert result.cancelled is None
    assert under_test.leftovers(tmp_path / "state") == []


def test_cancel_is_idempotent_and_its_first_reason_stands(
    backend: Backend, under_test: BackendUnderTest, tmp_path: Path
) -> None:
    handle = backend.submit(under_test.job(tmp_path, "long", "long1"))
    wait_running(backend, handle)
    backend.cancel(handle, "timeout after 5s")
    backend.cancel(handle, "again")
    result = run_to_end(backend, handle, timeout_s=30)
    assert result.cancelled == "timeout after 5s"
    assert result.exit_code != 0
    assert backend.poll(handle), "a finished job stays finished"
    assert under_test.leftovers(tmp_path / "state") == []


def test_several_jobs_run_at_once_and_close_ends_them(under_test: BackendUnderTest, tmp_path: Path) -> None:
    backend = under_test.make(tmp_path / "state")
    backend.open()
    handles = [backend.submit(under_test.job(tmp_path, "long", f"long{i}")) for i in range(2)]
    quick = backend.submit(under_test.job(tmp_path, "ok", "quick"))
    assert run_to_end(backend, quick).exit_code == 0, "a short job ends while long ones run beside it"
    assert not any(backend.poll(h) for h in handles)
    backend.close()
    assert under_test.leftovers(tmp_path / "state") == []
