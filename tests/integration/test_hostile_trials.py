"""Trials are untrusted: a study whose candidates attack the harness from inside their trials
(``support.hostile_workload``), run by the real launcher and telemetry services on a nats-server with
authorization on — as ``infrarsi up`` runs them — each trial in the bubblewrap sandbox.

Every attack is judged by what the host sees: the seeds under ``<data>/creds`` never appear in a job's output,
no event lands that a trial forged, no step lands on another trial's subject, no file appears or changes outside
the trial's worktree, the analyst database's rows never reach a job, the test's listener on loopback is never
connected to. Each attacking trial is still measured (it trains after its attack), and so is the honest patch.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from infrarsi import events as ev
from infrarsi.bus import credentials
from infrarsi.bus.client import Bus
from infrarsi.bus.embedded import EmbeddedServer
from infrarsi.bus.subjects import LIFECYCLE_STREAM, TELEMETRY_STREAM, lifecycle_subject, telemetry_subject
from support.hostile_workload import ATTACKS, HONEST, STEPS, write_hostile_workload
from test_launcher_helpers import Harness, launcher, telemetry

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TRIAL_TIMEOUT_S = 420.0
ANALYST_SECRET = "analyst-secret-7f3c"


@dataclass
class Listener:
    """A TCP listener on loopback that is not the bus: what a trial must not reach."""

    port: int
    accepted: list[bytes] = field(default_factory=list)


@pytest.fixture
def listener() -> Iterator[Listener]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.settimeout(0.2)
    found = Listener(port=sock.getsockname()[1])
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(2)
                with contextlib.suppress(OSError):
                    found.accepted.append(conn.recv(100))

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield found
    finally:
        stop.set()
        thread.join(5)
        sock.close()


class AuthorizedHarness(Harness):
    """``Harness`` on a server with authorization: every party connects with its own seed of ``data_dir``."""

    own_service = credentials.ADMIN

    async def connect(self, service: str) -> Bus:
        return await Bus.connect(self.url, service=service, data_dir=self.data_dir)


def write_analyst_db(data_dir: Path) -> Path:
    import duckdb

    path = data_dir / "reporter" / "analyst.duckdb"
    path.parent.mkdir(parents=True, exist_ok=True)
    with duckdb.connect(str(path)) as db:
        db.execute("CREATE TABLE secret (marker VARCHAR)")
        db.execute("INSERT INTO secret VALUES (?)", [ANALYST_SECRET])
    return path


async def telemetry_counts(bus: Bus, study: str) -> dict[str, int]:
    """Messages per telemetry subject of ``study``, and per envelope trial id (``envelope:<trial>``)."""
    counts: dict[str, int] = {}
    async for event in bus.events(TELEMETRY_STREAM, telemetry_subject(study, "*")):
        counts[f"envelope:{event.trial_id}"] = counts.get(f"envelope:{event.trial_id}", 0) + 1
    info = await bus.js.stream_info(TELEMETRY_STREAM, subjects_filter=telemetry_subject(study, ">"))
    counts.update(info.state.subjects or {})
    return counts


def job_output(data_dir: Path, trial: str) -> str:
    return (data_dir / "launcher" / "trials" / trial / "node0.log").read_text(errors="replace")


@dataclass
class HostileStudy:
    """What the host saw of one study of the hostile library: every trial's events and output, the seeds, the
    study's lifecycle types and telemetry counts, and whether the victim's record changed."""

    data_dir: Path
    base: str
    trials: dict[str, str]
    events: dict[str, dict[str, ev.Payload]]
    outputs: dict[str, str]
    seeds: dict[str, str]
    lifecycle_types: set[str]
    telemetry: dict[str, int]
    victim_record_changed: bool


async def run_hostile_study(
    tmp_path: Path, listener: Listener, isolation: str, *, backend: dict | None = None,
    patches: tuple[str, ...] = (*ATTACKS, HONEST),
) -> HostileStudy:  # fmt: skip
    """The baseline, then each of ``patches`` (every attack and the honest patch), one trial each, in one study;
    on the local backend with ``isolation``, or on ``backend``."""
    data_dir = (tmp_path / "data").absolute()
    server = EmbeddedServer.start(data_dir, authorize=True)
    write_analyst_db(data_dir)
    contract = write_hostile_workload(tmp_path, listener_port=listener.port, isolation=isolation, backend=backend)
    h = AuthorizedHarness(server.url, data_dir)
    await h.open()
    try:
        await h.serve(launcher(h, server.url))
        await h.serve(telemetry(h, server.url))
        study = await h.create_study(contract)
        base = await h.propose(study, kind="baseline")
        assert (await h.wait_for(base, "TrialMeasured", TRIAL_TIMEOUT_S)).status == "ok", h.events[base]
        victim_finished = (data_dir / "launcher" / "trials" / base / "finished.json").read_bytes()
        trials = {}
        for name in patches:
            trials[name] = await h.propose(study, patches=[name])
            await h.wait_for(trials[name], "TrialMeasured", TRIAL_TIMEOUT_S)
        lifecycle = {e.type async for e in h.bus.events(LIFECYCLE_STREAM, lifecycle_subject(study, "*"))}
        return HostileStudy(
            data_dir=data_dir, base=base, trials=trials, events=dict(h.events),
            outputs={name: job_output(data_dir, trial) for name, trial in trials.items()},
            seeds={p.name: p.read_text().strip() for p in (data_dir / "creds").glob("*.nk")},
            lifecycle_types=lifecycle, telemetry=await telemetry_counts(h.bus, study),
            victim_record_changed=(data_dir / "launcher" / "trials" / base / "finished.json").read_bytes()
            != victim_finished,
        )  # fmt: skip
    finally:
        await h.close()
        server.stop()


async def test_hostile_patches_are_contained_and_still_measured(tmp_path, sandbox_ready, listener) -> None:
    if sandbox_ready is not None:
        pytest.skip(f"no sandbox: {sandbox_ready}")
    seen = await run_hostile_study(tmp_path, listener, "sandbox")
    assert "admin.nk" in seen.seeds and "probe.nk" in seen.seeds
    for name, trial in seen.trials.items():
        finished, measured = seen.events[trial]["TrialFinished"], seen.events[trial]["TrialMeasured"]
        assert seen.events[trial]["TrialLaunched"].isolation == "bwrap"
        assert finished.status == "ok", (name, finished.reason, finished.output_tail)
        assert measured.status == "ok" and measured.steps == STEPS, (name, measured)
        output = seen.outputs[name]
        if name != HONEST:
            # the attack ran (a test whose attack never ran could not fail); what it got is judged by what the
            # host sees (a write it reports may have landed in its private /tmp, gone with it)
            assert f"ATTACK {name}: " in output, output[-3000:]
        for seed_name, seed in seen.seeds.items():
            assert seed not in output, f"{name}: the job printed {seed_name}"
        assert ANALYST_SECRET not in output, f"{name}: the job read the analyst database"
        assert not (Path("/tmp") / f"irsi-hostile-{trial}").exists()
    assert seen.events[seen.trials[HONEST]]["TrialMeasured"].invariants_ok
    # publish-as-admin: nothing forged landed
    assert "StudyFinished" not in seen.lifecycle_types
    # steps-into-other-trial: every trial's subject holds its own steps only, no subject of a trial that did
    # not run, and no envelope of another trial was relayed
    study = seen.events[seen.base]["TrialMeasured"]
    ran = [seen.base, *seen.trials.values()]
    subjects = {s: n for s, n in seen.telemetry.items() if not s.startswith("envelope:")}
    envelopes = {s: n for s, n in seen.telemetry.items() if s.startswith("envelope:")}
    assert len(subjects) == len(ran) and set(subjects.values()) == {STEPS}, (study, seen.telemetry)
    assert envelopes == {f"envelope:{t}": STEPS for t in ran}, seen.telemetry
    # write-outside: nothing in the data directory, the victim's record untouched
    assert not (seen.data_dir / "PWNED").exists()
    assert not seen.victim_record_changed
    # local-port: the listener on loopback was never reached
    assert listener.accepted == []


async def test_without_the_sandbox_every_attack_gets_through(tmp_path, listener) -> None:
    """``isolation: none`` (what every trial got before the sandbox): the same patches read the seeds and the
    analyst database, forge a lifecycle event as the proposer, write steps into other trials and files outside
    the worktree, and reach a port on loopback — the attacks are real, so the test above can fail."""
    seen = await run_hostile_study(tmp_path, listener, "none")
    try:
        for trial in seen.trials.values():
            assert seen.events[trial]["TrialLaunched"].isolation == "none"
        assert seen.seeds["admin.nk"] in seen.outputs["read-seed"]
        assert ANALYST_SECRET in seen.outputs["read-analyst-db"]
        assert "StudyFinished" in seen.lifecycle_types
        assert seen.telemetry[f"envelope:{seen.base}"] > STEPS, seen.telemetry  # steps forged into the baseline
        assert (seen.data_dir / "PWNED").exists() and seen.victim_record_changed
        assert listener.accepted, "the job never reached the listener"
    finally:
        for trial in seen.trials.values():
            (Path("/tmp") / f"irsi-hostile-{trial}").unlink(missing_ok=True)


SLURM_ATTACKS = ("read-seed", "write-outside", "read-analyst-db")


@pytest.mark.slurm
async def test_slurm_trials_cannot_read_creds_or_write_outside(tmp_path, sandbox_ready, slurm_cluster, listener) -> None:
    """Through the tests' real Slurm cluster, isolation left at its default (``auto``): each node starts its job
    in the sandbox, so the attack reading the seeds under ``creds/``, the one reading the analyst database and
    the one writing outside its worktree get nothing the host can see, and each trial (the honest one too) is
    still measured. Without the sandbox on the nodes (before it), each of them got through."""
    if sandbox_ready is not None:
        pytest.skip(f"no sandbox: {sandbox_ready}")
    seen = await run_hostile_study(tmp_path, listener, "auto", backend={"kind": "slurm", "time_limit": "10"},
                                   patches=(*SLURM_ATTACKS, HONEST))  # fmt: skip
    assert "admin.nk" in seen.seeds and "probe.nk" in seen.seeds
    for name, trial in seen.trials.items():
        output = seen.outputs[name]
        if name != HONEST:
            assert f"ATTACK {name}: " in output, output[-3000:]  # the attack ran on the node
        for seed_name, seed in seen.seeds.items():
            assert seed not in output, f"{name}: the job printed {seed_name}"
        assert ANALYST_SECRET not in output, f"{name}: the job read the analyst database"
        assert not (Path("/tmp") / f"irsi-hostile-{trial}").exists()
        launched = seen.events[trial]["TrialLaunched"]
        finished, measured = seen.events[trial]["TrialFinished"], seen.events[trial]["TrialMeasured"]
        assert launched.backend == "slurm" and launched.isolation == "bwrap", launched
        assert finished.status == "ok", (name, finished.reason, finished.output_tail)
        assert measured.status == "ok" and measured.steps == STEPS, (name, measured)
    assert "blocked: no " in seen.outputs["read-seed"], seen.outputs["read-seed"][-2000:]
    assert not (seen.data_dir / "PWNED").exists()
    assert not seen.victim_record_changed
    assert seen.events[seen.trials[HONEST]]["TrialMeasured"].invariants_ok
