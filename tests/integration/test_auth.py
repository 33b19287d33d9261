"""The bus with authorization on, against a real nats-server: no credentials, no connection; each principal
publishes only the event types the subjects table gives it; credentials are files only their owner reads."""

from __future__ import annotations

import stat
from pathlib import Path
from types import SimpleNamespace

import pytest
from infrarsi import events as ev
from infrarsi.bus import credentials
from infrarsi.bus.client import Bus, BusError
from infrarsi.bus.embedded import EmbeddedServer
from infrarsi.bus.reader import read_stream
from infrarsi.bus.subjects import LIFECYCLE_STREAM, lifecycle_subject
from infrarsi.runtime.stack import Stack

pytestmark = pytest.mark.integration


@pytest.fixture()
def server(tmp_path: Path):
    with EmbeddedServer.start(tmp_path / "data", authorize=True) as running:
        yield running


def study_finished() -> ev.StudyFinished:
    return ev.StudyFinished(reason="test", trials=0, accelerator_s=0.0)


async def stored_types(server: EmbeddedServer) -> list[str]:
    admin = await Bus.connect(server.url, service=credentials.ADMIN, data_dir=server.data_dir, ensure=False)
    try:
        return [e.type async for e in admin.events(LIFECYCLE_STREAM, lifecycle_subject("*", "*"))]
    finally:
        await admin.close()


async def test_connection_without_credentials_refused(server: EmbeddedServer, monkeypatch) -> None:
    monkeypatch.delenv(credentials.NKEY_FILE_ENV, raising=False)
    with pytest.raises(BusError, match="(?i)authorization.*none found for 'intruder'"):
        await Bus.connect(server.url, service="intruder", connect_timeout_s=10.0)
    # a principal's name without its seed is no better
    with pytest.raises(BusError, match="(?i)authorization"):
        await Bus.connect(server.url, service="verifier", connect_timeout_s=10.0)


async def test_publish_outside_rights_refused(server: EmbeddedServer) -> None:
    proposer = await Bus.connect(server.url, service="proposer", data_dir=server.data_dir)
    proposer.js = proposer.nc.jetstream(timeout=1.0)  # a refused publish is never acked: do not wait 10 s
    try:
        await proposer.publish(ev.make_event(study_finished(), study_id="s1", source="proposer"))  # its own
        forged = ev.VerifyCompleted(
            verify_id="v", candidate=ev.Candidate(), candidate_key="k", passes=2, promotable=True, speedup=9.0,
            ci_low=8.0, ci_high=10.0, baseline_step_s=1.0, candidate_step_s=0.1, mfu_before=None,
            mfu_after=None, invariants=[], failed_invariants=[], trial_ids=[],
        )
        with pytest.raises(BusError, match="not acknowledged"):
            await proposer.publish(ev.make_event(forged, study_id="s1", source="verifier"))
        approval = ev.ApprovalGranted(candidate_key="k", role="owner", approver="x", action_classes=[])
        with pytest.raises(BusError, match="not acknowledged"):
            await proposer.publish(ev.make_event(approval, study_id="s1", source="cli.approve"))
    finally:
        await proposer.close()
    assert await stored_types(server) == ["StudyFinished"]


async def test_credential_files_private(server: EmbeddedServer) -> None:
    directory = credentials.creds_dir(server.data_dir)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    seeds = sorted(directory.iterdir())
    assert {p.name for p in seeds} >= {"admin.nk", "probe.nk", "launcher.nk", "cli.approve.nk"}
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in seeds)
    config = (server.data_dir / "nats-server.conf").read_text()
    for seed in seeds:  # the server's config holds public keys only
        assert seed.read_text().strip() not in config


def test_stack_services_connect_with_their_credentials(tmp_path: Path) -> None:
    """``Stack.start`` (what ``infrarsi up`` runs) turns authorization on and every service still answers."""
    with Stack.start(tmp_path / "data", services=("proposer", "verifier")) as stack:
        assert credentials.has_credentials(stack.data_dir)
        assert "authorization" in (stack.data_dir / "nats-server.conf").read_text()


async def test_trial_job_publishes_steps_as_the_probe_only(server: EmbeddedServer) -> None:
    """A job run by hand with the probe's seed file (``$INFRARSI_NKEY_FILE``; the launcher hands trials none and
    relays their steps): its steps land, and the same connection cannot publish a lifecycle event."""
    from infrarsi.bus.subjects import TELEMETRY_STREAM, step_msg_id, telemetry_subject
    from infrarsi.probe.sinks import NatsPublisher

    seed = credentials.stored("probe", server.data_dir)
    assert seed is not None
    await (await Bus.connect(server.url, service=credentials.ADMIN, data_dir=server.data_dir)).close()  # streams
    step = ev.TrialStep(rank=0, world_size=1, step=0, loss=1.0, step_time_s=0.1, tokens=8, optimizer_steps=1,
                        peak_memory_bytes=1)
    publisher = NatsPublisher(server.url, nkey_file=str(seed.seed_file))
    publisher.publish(telemetry_subject("s1", "t1"), ev.encode(ev.make_event(step, study_id="s1", trial_id="t1",
                      source="probe")), {"Nats-Msg-Id": step_msg_id("t1", 0, 0)})
    publisher.publish(lifecycle_subject("s1", "TrialMeasured"), b"{}", {"Nats-Msg-Id": "forged"})
    publisher.close(timeout_s=20.0)  # the refused publish is never acked: it fails after the JetStream timeout
    assert (publisher.published, publisher.failed) == (1, 1)
    admin = await Bus.connect(server.url, service=credentials.ADMIN, data_dir=server.data_dir, ensure=False)
    try:
        assert (await admin.stream_counts())[TELEMETRY_STREAM]["messages"] == 1
    finally:
        await admin.close()
    assert await stored_types(server) == []


async def test_consumers_refuse_an_event_its_publisher_may_not_own(bus: Bus) -> None:
    """Every service's consume loop decodes through ``decode_delivery``: an event claimed by a principal the
    table does not list for its type, or on another type's subject, is a bad message (dead-lettered)."""
    from infrarsi.bus.client import decode_delivery

    study = ev.new_id()
    finished = ev.StudyFinished(reason="r", trials=0, accelerator_s=0.0)
    await bus.publish(ev.make_event(finished, study_id=study, source="proposer"))
    await bus.publish(ev.make_event(finished, study_id=study, source="cli.apply"))
    smuggled = ev.make_event(finished, study_id=study, source="proposer")
    await bus.publish_raw(lifecycle_subject(study, "TrialProposed"), ev.encode(smuggled))
    seen = []
    async for msgs in read_stream(bus, LIFECYCLE_STREAM, subjects=lifecycle_subject(study, "*")):
        seen += [decode_delivery(SimpleNamespace(subject=subject, data=data)) for _seq, subject, data in msgs]
    assert [d.error for d in seen] == [
        None,
        "wrong owner: cli.apply does not publish StudyFinished (published by proposer)",
        f"misrouted: a StudyFinished of study {study!r} belongs on irsi.{study}.StudyFinished, "
        f"not irsi.{study}.TrialProposed",
    ]


async def test_creds_verb_writes_an_authorization_block_a_server_loads(tmp_path: Path, capsys) -> None:
    """``infrarsi creds`` (for deployments): seeds kept across runs, and an auth.conf nats-server accepts."""
    import argparse
    import json
    import subprocess

    from infrarsi.bus.embedded import nats_server_binary
    from infrarsi.commands import creds

    args = argparse.Namespace(data_dir=tmp_path / "d", json=True, leaf_link=False, hub_user=[])
    assert await creds.run(args) == 0
    first = json.loads(capsys.readouterr().out)
    assert await creds.run(args) == 0
    assert json.loads(capsys.readouterr().out)["principals"] == first["principals"]  # the same keys again
    assert set(first["principals"]) >= {"admin", "launcher", "probe", "cli.apply"}
    conf = tmp_path / "server.conf"
    conf.write_text('listen: 127.0.0.1:-1\ninclude "d/creds/auth.conf"\n')  # relative to the config
    result = subprocess.run([str(nats_server_binary()), "-c", str(conf), "-t"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
