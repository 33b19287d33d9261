"""The bus with authorization on, against a real nats-server: no credentials, no connection; each principal
publishes only the event types the subjects table gives it; credentials are files only their owner reads."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from infrarsi import credentials
from infrarsi import events as ev
from infrarsi.bus import Bus, BusError
from infrarsi.embedded import EmbeddedServer
from infrarsi.stack import Stack
from infrarsi.subjects import LIFECYCLE_STREAM, lifecycle_subject

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
        await Bus.connect(server.url, service="intruder", connect_timeout_s=2.0)
    # a principal's name without its seed is no better
    with pytest.raises(BusError, match="(?i)authorization"):
        await Bus.connect(server.url, service="verifier", connect_timeout_s=2.0)


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
