"""The bank shared across two clusters through a hub, with JetStream sourcing over leaf nodes.

Three real nats-server processes on loopback: a hub (domain ``hub``) and two clusters (domains ``cluster-a``,
``cluster-b``), each cluster a leaf node of the hub, configured with the same fragments as deploy/nats/bank/.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
import urllib.request
from collections.abc import Awaitable, Callable
from pathlib import Path

import duckdb
import nats
import nats.errors
import pytest
from infrarsi import events as ev
from infrarsi.bank import (
    HUB_STREAM,
    SHARED_STREAM,
    bank_event,
    ensure_bank_federation,
    read_bank_entries,
    server_config_fragment,
)
from infrarsi.bank.federation import read_bank_events
from infrarsi.bank.store import replay_bank
from infrarsi.bus import credentials, subjects
from infrarsi.bus.client import BANK_STREAM, LIFECYCLE_STREAM, TELEMETRY_STREAM, Bus, BusError
from infrarsi.bus.embedded import EmbeddedServer, free_port
from nats.aio.msg import Msg
from support.owned import owned_event

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]
SEED = re.compile(r"\bSU[A-Z2-7]{50,}")
"""A user nkey seed (base32, ``SU…``): must never be in a server config."""


def entry(study: str, accelerator: str = "H100-80G") -> ev.BankEntry:
    meta = ev.BankMeta(accelerator=accelerator, generation="", device_memory_bytes=80 * 2**30, interconnect="ib",
                       nodes=8, devices_per_node=8, parallelism={"dp": 64}, model_family="dense",
                       model_params=6.7e9, seq_len=4096, global_batch=512, micro_batch=1, precision="bf16")
    effect = ev.Effect(feature="flash_attention", prior_mean=-0.15, prior_std=0.1, post_mean=-0.2, post_std=0.03)
    return ev.BankEntry(entry_id=ev.derived_id(study, "BankEntry"), origin_study=study, meta=meta,
                        time_effects=[effect], memory_effects=[],
                        winners=[ev.Candidate(knobs={"micro_batch": 2}, patches=["fused_kernels"])])


async def wait_for(predicate: Callable[[], Awaitable[bool]], timeout_s: float = 30.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await predicate():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")


async def ids(bus: Bus) -> list[str]:
    return [e.origin_study for e in await read_bank_entries(bus)]


async def count(bus: Bus, stream: str) -> int:
    return (await bus.js.stream_info(stream)).state.messages


class Federation:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.leaf_port = free_port()
        self.hub_port = free_port()
        self.hub: EmbeddedServer | None = None
        self.clusters: dict[str, EmbeddedServer] = {}

    def start_hub(self, users: dict[str, str] | None = None) -> EmbeddedServer:
        d = self.root / "hub"
        self.hub = EmbeddedServer.start(d, port=self.hub_port, server_name="bank-hub", extra_config=server_config_fragment(
            "hub", domain="hub", store_dir=d / "jetstream", leaf_listen=f"127.0.0.1:{self.leaf_port}", hub_users=users))
        return self.hub

    def start_cluster(self, name: str, *, authorize: bool = False, link: str | None = None) -> EmbeddedServer:
        d = self.root / name
        server = EmbeddedServer.start(d, server_name=f"bank-{name}", authorize=authorize, bank_link=True, extra_config=server_config_fragment(
            "leaf", domain=name, store_dir=d / "jetstream", hub_leaf_urls=[f"nats-leaf://127.0.0.1:{self.leaf_port}"],
            leaf_credentials=link))
        self.clusters[name] = server
        return server

    def stop(self) -> None:
        for s in [*self.clusters.values(), self.hub]:
            if s is not None:
                s.stop()


async def test_entries_cross_clusters_survive_a_cut_and_converge_without_duplicates(tmp_path: Path) -> None:
    fed = Federation(tmp_path)
    try:
        hub = fed.start_hub()
        a_srv, b_srv = fed.start_cluster("cluster-a"), fed.start_cluster("cluster-b")
        a = await Bus.connect(a_srv.url, service="test-bank-a", replicas=1)
        b = await Bus.connect(b_srv.url, service="test-bank-b", replicas=1)
        h = await Bus.connect(hub.url, service="test-bank-hub", ensure=False, replicas=1)
        await ensure_bank_federation(h, "hub", "cluster-a", "cluster-b")
        await ensure_bank_federation(a, "leaf", peer_clusters=["cluster-b"])
        await ensure_bank_federation(b, "leaf", peer_clusters=["cluster-a"])
        # idempotent: a second call changes nothing and does not fail
        await ensure_bank_federation(b, "leaf", peer_clusters=["cluster-a"])

        # 1. published on A, readable on B (and A reads its own at once)
        e1 = bank_event(entry("study-1"), cluster_id="cluster-a")
        await a.publish(e1)
        assert await ids(a) == ["study-1"]
        await wait_for(lambda: _has(b, {"study-1"}), what="study-1 on B")
        assert await count(b, BANK_STREAM) == 0, "B's local stream must not capture A's publish over the leaf link"

        # 2. cut the link: stop the hub. Both clusters keep publishing and reading locally.
        await h.close()
        hub.stop()
        await a.publish(bank_event(entry("study-2"), cluster_id="cluster-a"))
        await b.publish(bank_event(entry("study-3", "A100-80G"), cluster_id="cluster-b"))
        assert set(await ids(a)) == {"study-1", "study-2"}
        assert set(await ids(b)) == {"study-1", "study-3"}

        # 3. the hub comes back with its store: the sources resume and both sides converge
        hub = fed.start_hub()
        everything = {"study-1", "study-2", "study-3"}
        # (JetStream retries a failed source with a 10 s × failures back-off: catching up takes tens of seconds)
        await wait_for(lambda: _has(a, everything), timeout_s=75, what="A to converge")
        await wait_for(lambda: _has(b, everything), timeout_s=75, what="B to converge")

        # a re-publication of the same event is deduplicated by JetStream (Nats-Msg-Id = event id)
        ack = await a.publish(e1)
        assert ack.duplicate

        # 4. no duplicates anywhere: each cluster holds its own entries once and the others' once
        h = await Bus.connect(hub.url, service="test-bank-hub", ensure=False, replicas=1)
        await wait_for(lambda: _count_is(h, HUB_STREAM, 3), what="hub aggregate of 3")
        assert (await count(a, BANK_STREAM), await count(a, SHARED_STREAM)) == (2, 1)
        assert (await count(b, BANK_STREAM), await count(b, SHARED_STREAM)) == (1, 2)
        for bus in (a, b):
            events = await read_bank_events(bus)
            assert len(events) == len({e.event_id for e in events}) == 3

        # 5. the DuckDB replay is the same table from either side
        tables = []
        for bus in (a, b):
            con = duckdb.connect()
            await replay_bank(bus, con)
            assert await replay_bank(bus, con) == 0, "a second replay from the recorded positions writes nothing"
            tables.append(con.execute("SELECT * FROM bank ORDER BY entry_id").fetchall())
        assert tables[0] == tables[1]
        assert [row[2] for row in tables[0]] == sorted(["study-1", "study-2", "study-3"], key=lambda s:
                                                        ev.derived_id(s, "BankEntry"))
        for bus in (a, b, h):
            await bus.close()
    finally:
        fed.stop()


async def _has(bus: Bus, studies: set[str]) -> bool:
    return set(await ids(bus)) == studies


async def _count_is(bus: Bus, stream: str, n: int) -> bool:
    return await count(bus, stream) == n


async def test_federation_with_authorization_on(tmp_path: Path) -> None:
    """Clusters whose servers run with authorization (as `infrarsi up` starts them): `bank federate` as cli.bank
    creates the shared stream, the reporter's entry on A reaches B, and B's readers of the bank (the reporter,
    `init`) read the shared stream with their own credentials; a principal with no bank rights may not create
    a federation stream. Before the federation streams were in the generated permissions, cli.bank was refused
    and a reader saw only its local stream."""
    fed = Federation(tmp_path)
    buses: list[Bus] = []

    async def as_principal(server: EmbeddedServer, principal: str) -> Bus:
        bus = await Bus.connect(server.url, service=principal, data_dir=server.data_dir, ensure=False, replicas=1)
        buses.append(bus)
        return bus

    try:
        hub = fed.start_hub()
        a_srv = fed.start_cluster("cluster-a", authorize=True)
        b_srv = fed.start_cluster("cluster-b", authorize=True)
        h = await Bus.connect(hub.url, service="test-bank-hub", ensure=False, replicas=1)
        buses.append(h)
        await ensure_bank_federation(h, "hub", "cluster-a", "cluster-b")
        await ensure_bank_federation(await as_principal(a_srv, "cli.bank"), "leaf", peer_clusters=["cluster-b"])
        await ensure_bank_federation(await as_principal(b_srv, "cli.bank"), "leaf", peer_clusters=["cluster-a"])
        with pytest.raises(nats.errors.Error):  # a permissions violation: the request gets no answer
            await ensure_bank_federation(await as_principal(b_srv, "launcher"), "leaf", peer_clusters=["cluster-a"])

        await (await as_principal(a_srv, "reporter")).publish(bank_event(entry("study-1"), cluster_id="cluster-a"))
        for principal in ("reporter", "cli.init", "cli.bank"):
            reader = await as_principal(b_srv, principal)
            await wait_for(lambda r=reader: _has(r, {"study-1"}), what=f"study-1 on B, read as {principal}")
        assert await count(await as_principal(b_srv, "cli.bank"), SHARED_STREAM) == 1
    finally:
        for bus in buses:
            with contextlib.suppress(Exception):
                await bus.close()
        fed.stop()


def _leafs(hub: EmbeddedServer) -> list[dict]:
    with urllib.request.urlopen(f"http://127.0.0.1:{hub.monitor_port}/leafz", timeout=5) as page:
        return json.load(page)["leafs"] or []


async def test_the_hub_requires_credentials_and_binds_leaf_links_to_its_bank_account(tmp_path: Path) -> None:
    """A hub started with its users (the clusters' leaf-link keys and its operator, ``cli.bank``): clusters A and
    B, whose links carry their seeds, share an entry through it; cluster C, whose link has no credentials, and a
    client without credentials are refused; every accepted link is bound to the hub's BANK account. Before,
    the hub accepted any leaf and any client into its global account."""
    fed = Federation(tmp_path)
    buses: list[Bus] = []
    try:
        hub_dir, operator_dir = tmp_path / "hub", tmp_path / "hub-operator"  # the operator's seed is theirs
        operator = credentials.ensure(operator_dir)["cli.bank"]
        links = {name: credentials.ensure_leaf_link(tmp_path / name) for name in ("cluster-a", "cluster-b")}
        for _, include in links.values():
            assert include.stat().st_mode & 0o777 == 0o600
        hub = fed.start_hub(users={"operator": operator, **{n: key for n, (key, _) in links.items()}})
        assert not SEED.search((hub_dir / "nats-server.conf").read_text()), "a seed in the hub's config"
        a_srv = fed.start_cluster("cluster-a", link=credentials.LEAF_LINK_INCLUDE)
        b_srv = fed.start_cluster("cluster-b", link=credentials.LEAF_LINK_INCLUDE)
        c_srv = fed.start_cluster("cluster-c")
        assert not SEED.search((tmp_path / "cluster-a" / "nats-server.conf").read_text()), "a seed in the leaf's config"

        with pytest.raises(BusError, match="(?i)authorization"):
            await Bus.connect(hub.url, service="intruder", ensure=False, connect_timeout_s=3.0)
        h = await Bus.connect(hub.url, service="cli.bank", data_dir=operator_dir, ensure=False, replicas=1)
        buses.append(h)
        await ensure_bank_federation(h, "hub", "cluster-a", "cluster-b")
        a = await Bus.connect(a_srv.url, service="test-bank-a", replicas=1)
        b = await Bus.connect(b_srv.url, service="test-bank-b", replicas=1)
        buses += [a, b]
        await ensure_bank_federation(a, "leaf", peer_clusters=["cluster-b"])
        await ensure_bank_federation(b, "leaf", peer_clusters=["cluster-a"])
        await a.publish(bank_event(entry("study-1"), cluster_id="cluster-a"))
        await wait_for(lambda: _has(b, {"study-1"}), timeout_s=60, what="study-1 on B through the hub")

        leafs = _leafs(hub)
        assert sorted(leaf["name"] for leaf in leafs) == ["bank-cluster-a", "bank-cluster-b"]
        assert {leaf["account"] for leaf in leafs} == {credentials.BANK_ACCOUNT}
        assert "Authorization Violation" in (tmp_path / "cluster-c" / "nats-server.log").read_text()
        assert c_srv.process is not None and c_srv.process.poll() is None, "C keeps serving its own clients"
    finally:
        for bus in buses:
            with contextlib.suppress(Exception):
                await bus.close()
        fed.stop()


async def _hub_request(client: nats.NATS, subject: str, body: dict | None = None) -> dict:
    reply = await client.request(subject, json.dumps(body or {}).encode(), timeout=5.0)
    return json.loads(reply.data)


async def test_the_leaf_link_reaches_only_the_clusters_bank_account(tmp_path: Path) -> None:
    """Each cluster binds its leaf link to its own BANK account (JetStream holding only the link's copies of the
    bank); the principals stay in theirs. Entries still cross both ways and the principals read and write the
    bank as before; an attacker holding a hub credential — here cluster B's link seed, used as a client of the
    hub — sees only cluster A's BANK streams through ``$JS.cluster-a.API``: the lifecycle and telemetry streams
    are "not found" to it (info, a consumer, a message), the link's own copies cannot be purged, changed or
    deleted from the hub (the link does not take those requests), its publishes on ``irsi.>``, ``bank.>`` and a principal's
    inbox never arrive on A, and a subscription to everything on the hub sees none of A's lifecycle events or
    inboxes. Before, A's link joined the principals' account: the same requests listed and read IRSI."""
    fed = Federation(tmp_path)
    buses: list[Bus] = []
    clients: list[nats.NATS] = []

    async def as_principal(server: EmbeddedServer, principal: str) -> Bus:
        bus = await Bus.connect(server.url, service=principal, data_dir=server.data_dir, ensure=False, replicas=1)
        buses.append(bus)
        return bus

    try:
        operator_dir = tmp_path / "hub-operator"
        operator = credentials.ensure(operator_dir)["cli.bank"]
        links = {name: credentials.ensure_leaf_link(tmp_path / name) for name in ("cluster-a", "cluster-b")}
        hub = fed.start_hub(users={"operator": operator, **{n: key for n, (key, _) in links.items()}})
        a_srv = fed.start_cluster("cluster-a", authorize=True, link=credentials.LEAF_LINK_INCLUDE)
        b_srv = fed.start_cluster("cluster-b", authorize=True, link=credentials.LEAF_LINK_INCLUDE)
        h = await Bus.connect(hub.url, service="cli.bank", data_dir=operator_dir, ensure=False, replicas=1)
        buses.append(h)
        await ensure_bank_federation(h, "hub", "cluster-a", "cluster-b")
        await ensure_bank_federation(await as_principal(a_srv, "cli.bank"), "leaf", peer_clusters=["cluster-b"])
        await ensure_bank_federation(await as_principal(b_srv, "cli.bank"), "leaf", peer_clusters=["cluster-a"])

        # the principals write and read the bank as before, and entries cross both ways
        await (await as_principal(a_srv, "reporter")).publish(bank_event(entry("study-a"), cluster_id="cluster-a"))
        await (await as_principal(b_srv, "reporter")).publish(bank_event(entry("study-b"), cluster_id="cluster-b"))
        for server in (a_srv, b_srv):
            for principal in ("reporter", "cli.init"):
                reader = await as_principal(server, principal)
                await wait_for(lambda r=reader: _has(r, {"study-a", "study-b"}), timeout_s=60,
                               what=f"both entries on {server.data_dir.name}, read as {principal}")
        with urllib.request.urlopen(f"http://127.0.0.1:{a_srv.monitor_port}/leafz", timeout=5) as page:
            assert [leaf["account"] for leaf in json.load(page)["leafs"]] == [credentials.BANK_ACCOUNT]

        # the attacker: a client of the hub with a hub credential (cluster B's link seed)
        attacker = await nats.connect(hub.url, nkeys_seed=str(tmp_path / "cluster-b" / "creds" / "leaf-link.nk"),
                                      inbox_prefix="_SPY")  # (replies to _INBOX.> are not let out by the link)
        clients.append(attacker)
        seen: list[str] = []

        async def record(msg: Msg) -> None:
            seen.append(msg.subject)

        await attacker.subscribe(">", cb=record)
        api = "$JS.cluster-a.API"
        names = await _hub_request(attacker, f"{api}.STREAM.NAMES")
        assert sorted(names["streams"]) == sorted(credentials.LINK_STREAMS), names
        for stream in (LIFECYCLE_STREAM, TELEMETRY_STREAM):
            spy = {"stream_name": stream, "config": {"name": "spy", "deliver_subject": "spy", "ack_policy": "none"}}
            for request, body in ((f"STREAM.INFO.{stream}", None), (f"CONSUMER.CREATE.{stream}.spy", spy),
                                  (f"STREAM.MSG.GET.{stream}", {"seq": 1})):
                answer = await _hub_request(attacker, f"{api}.{request}", body)
                assert answer.get("error", {}).get("err_code") == 10059, (request, answer)  # stream not found
        # the link's own copies: readable (they are the bank, shared anyway), not to be emptied or removed — nor
        # any stream: the link does not take those requests at all
        assert (await _hub_request(attacker, f"{api}.STREAM.INFO.{BANK_STREAM}"))["state"]["messages"] == 1  # study-a
        for request in (f"STREAM.PURGE.{BANK_STREAM}", f"STREAM.DELETE.{SHARED_STREAM}",
                        f"STREAM.UPDATE.{BANK_STREAM}", f"STREAM.MSG.DELETE.{BANK_STREAM}",
                        f"STREAM.DELETE.{LIFECYCLE_STREAM}", f"STREAM.PURGE.{TELEMETRY_STREAM}"):
            with pytest.raises(nats.errors.TimeoutError):  # the link does not let the request in: no answer
                await attacker.request(f"{api}.{request}", b"{}", timeout=2.0)

        a_admin = await Bus.connect(a_srv.url, service=credentials.ADMIN, data_dir=a_srv.data_dir, ensure=False)
        buses.append(a_admin)
        before = await a_admin.stream_counts()
        inbox = await as_principal(a_srv, "cli.apply")
        landed: list[str] = []

        async def into_inbox(msg: Msg) -> None:
            landed.append(msg.subject)

        await inbox.nc.subscribe(f"{credentials.inbox_prefix('cli.apply')}.>", cb=into_inbox)
        forged = owned_event(ev.StudyFinished(reason="forged", trials=0, accelerator_s=0.0), study_id="s-1")
        sent = (subjects.subject_for(forged), f"{subjects.BANK_ROOT}.cluster-a.forged",
                f"{credentials.inbox_prefix('cli.apply')}.forged")
        for subject in sent:
            await attacker.publish(subject, ev.encode(forged))
        await attacker.flush()
        # A's own traffic the attacker must not see: a lifecycle event and a request on a principal's inbox
        await (await as_principal(a_srv, "proposer")).publish(owned_event(
            ev.StudyFinished(reason="real", trials=0, accelerator_s=0.0), study_id="s-2"))
        await a_admin.nc.publish(f"{credentials.inbox_prefix('cli.apply')}.own", b"x")  # (the inbox does work)
        # a bank entry published now: BANK's copy acks to the publisher's inbox subject, inside BANK
        await (await as_principal(a_srv, "reporter")).publish(bank_event(entry("study-c"), cluster_id="cluster-a"))
        await a_admin.nc.flush()
        await asyncio.sleep(1.0)  # a forwarded message would have arrived long before (loopback)
        after = await a_admin.stream_counts()
        assert after[LIFECYCLE_STREAM]["messages"] == before[LIFECYCLE_STREAM]["messages"] + 1  # the real one only
        assert after[BANK_STREAM]["messages"] == before[BANK_STREAM]["messages"] + 1  # study-c only
        assert landed == [f"{credentials.inbox_prefix('cli.apply')}.own"]
        leaked = [s for s in seen if s.startswith((f"{subjects.ROOT}.", "_INBOX_")) and s not in sent]
        assert sorted(set(seen) & set(sent)) == sorted(sent), "the spy hears the hub's own traffic"
        assert not leaked, leaked
    finally:
        for client in clients:
            with contextlib.suppress(Exception):
                await client.close()
        for bus in buses:
            with contextlib.suppress(Exception):
                await bus.close()
        fed.stop()
