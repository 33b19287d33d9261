"""Sharing the bank across clusters with JetStream's own sourcing over leaf nodes (no home-made sync).

Owns: the federation topology's stream definitions and ``ensure_bank_federation`` that creates them; the
server-config fragments that put a server in a JetStream domain and wire it as hub or leaf
(``server_config_fragment``, the same blocks as ``deploy/nats/bank/*.conf``); reading the bank a process sees
(``read_bank_entries``: the union of the local and shared streams, one entry per ``entry_id``).
Must not: copy messages itself, or touch the lifecycle streams.

Topology (docs/bank.md)::

      cluster-a (domain cluster-a)          hub (domain hub)              cluster-b (domain cluster-b)
      IRSI_BANK  bank.>  ──── sourced ──▶  IRSI_BANK_HUB  ◀── sourced ──── IRSI_BANK  bank.>
      IRSI_BANK_SHARED   ◀── sourced, filter bank.cluster-b.> ─┘└─ filter bank.cluster-a.> ──▶ IRSI_BANK_SHARED

- Each cluster publishes only to its own ``IRSI_BANK`` (subject ``bank.<cluster>.<entry>``); publishing never
  depends on the hub, so a cut-off cluster keeps working.
- The hub's ``IRSI_BANK_HUB`` has no subjects of its own: it *sources* every cluster's ``IRSI_BANK`` through
  ``$JS.<cluster domain>.API``. Each cluster's ``IRSI_BANK_SHARED`` sources the hub's aggregate back through
  ``$JS.hub.API``, filtered to the *other* clusters' subjects, so a cluster never stores its own entries twice.
  JetStream resumes a source from its last sequence after a disconnection: that is the catch-up.
- The leaf connection denies ``bank.>`` and ``irsi.>`` both ways: without it, core-NATS interest propagation
  would deliver a publish on cluster A straight into cluster B's ``IRSI_BANK`` (and lifecycle events into B's
  ``IRSI``), bypassing the domains — duplicates and cross-talk. Only the JetStream API and the sourcing
  consumers' traffic cross.
- On each cluster the leaf link is bound to its own account, ``BANK`` (``credentials.cluster_accounts_block``),
  whose JetStream holds only the link's copies: ``IRSI_BANK`` (every entry published on the cluster, copied
  from the principals' account as it is published — what the hub sources) and ``IRSI_BANK_SHARED`` (sourced
  from the hub). The principals' ``IRSI_BANK_SHARED`` sources ``BANK``'s through ``credentials.BANK_LINK_API``.
  So the hub, or anyone holding a hub credential, reaches the cluster's ``BANK`` account and nothing else: not
  its lifecycle streams, not its clients' subjects. Readers and publishers are unchanged: they use the
  principals' ``IRSI_BANK`` and ``IRSI_BANK_SHARED`` as before.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext, api

from infrarsi import events as ev
from infrarsi.bus import credentials
from infrarsi.bus.client import STREAMS, Bus
from infrarsi.bus.subjects import (
    ALL_BANK,
    ALL_IRSI,
    BANK_HUB_STREAM,
    BANK_SHARED_STREAM,
    BANK_STREAM,
    bank_subject,
    route,
)

HUB_STREAM = BANK_HUB_STREAM  # the subjects table's names, re-exported as federation spells them
SHARED_STREAM = BANK_SHARED_STREAM

HUB_DOMAIN = "hub"
LEAF_DENY = (ALL_BANK, ALL_IRSI)
"""Application subjects that must not cross a leaf connection (see the module docstring)."""
LEAF_DENY_EXPORTS = (*LEAF_DENY, "_INBOX.>", *(f"{credentials.inbox_prefix(p)}.>" for p in
                                               (*route("BankEntry").publishers, credentials.ADMIN)))
"""What the link also never sends to the hub: the reply subjects of bank publishes. Each entry published on
the cluster reaches ``BANK``'s ``IRSI_BANK`` with its publisher's reply subject, and ``BANK``'s JetStream acks
there — inside ``BANK``, where a subscriber on the hub could otherwise hear the acks (the publishers' inboxes:
the bank's publishers and ``admin``, or nats' default ``_INBOX`` without credentials)."""
LEAF_DENY_IMPORTS = (*LEAF_DENY, *(f"$JS.*.API.STREAM.{verb}.>" for verb in
                                   ("CREATE", "UPDATE", "DELETE", "PURGE", "MSG.DELETE", "SNAPSHOT", "RESTORE")))
"""What the link also never takes from the hub: requests that would create, change, empty or delete a stream of
the cluster's ``BANK`` account (``$JS.<cluster domain>.API.STREAM.…``). The hub's sourcing needs only to create
and delete its consumers and read; ``infrarsi bank federate leaf`` makes the link's streams from the cluster."""

Role = Literal["hub", "leaf"]


def api_prefix(domain: str) -> str:
    """The JetStream API prefix of a domain, as sourcing's ``external.api`` wants it."""
    return f"$JS.{domain}.API"


def cluster_subject(cluster_id: str) -> str:
    if not cluster_id or any(ch in cluster_id for ch in ".*> \t"):
        raise ValueError(f"cluster id {cluster_id!r} is not a single subject token")
    return bank_subject(cluster_id, ">")


def _sourced_stream(name: str, description: str, sources: list[api.StreamSource], replicas: int) -> api.StreamConfig:
    """A file-backed stream that only copies other streams' messages (limits retention, like the banks it sources)."""
    return api.StreamConfig(
        name=name,
        description=description,
        retention=api.RetentionPolicy.LIMITS,
        storage=api.StorageType.FILE,
        num_replicas=replicas,
        sources=sources,
    )


def hub_stream_config(leaf_domains: Sequence[str], replicas: int = 1) -> api.StreamConfig:
    """The hub's aggregate: one source per cluster's ``IRSI_BANK``, reached through that cluster's domain."""
    if not leaf_domains:
        raise ValueError("the hub needs at least one leaf domain to source from")
    return _sourced_stream(
        HUB_STREAM,
        "InfraRSI bank: every cluster's entries (sourced from each cluster's IRSI_BANK)",
        [api.StreamSource(name=BANK_STREAM, external=api.ExternalStream(api=api_prefix(d)))
         for d in sorted(set(leaf_domains))],
        replicas,
    )


def shared_stream_config(hub_domain: str = HUB_DOMAIN, peer_clusters: Sequence[str] | None = None,
                         replicas: int = 1) -> api.StreamConfig:
    """A cluster's copy of the other clusters' entries, sourced from the hub's aggregate.

    ``peer_clusters`` (cluster ids = subject tokens) filters the source to ``bank.<peer>.>`` — the recommended
    form, no copy of the cluster's own entries. ``None`` sources everything (adding a cluster then needs no
    change here); readers deduplicate by ``entry_id`` either way.
    """
    source = api.StreamSource(name=HUB_STREAM, external=api.ExternalStream(api=api_prefix(hub_domain)))
    if peer_clusters is not None:
        peers = sorted(set(peer_clusters))
        if not peers:
            raise ValueError("peer_clusters is empty: there is nothing to share")
        if len(peers) == 1:
            source.filter_subject = cluster_subject(peers[0])
        else:  # several filters on one source: subject transforms that map each filter onto itself
            source.subject_transforms = [api.SubjectTransform(src=cluster_subject(p), dest=cluster_subject(p))
                                         for p in peers]
    return _sourced_stream(
        SHARED_STREAM, "InfraRSI bank: other clusters' entries (sourced from the hub's IRSI_BANK_HUB)", [source], replicas
    )


async def _put_stream(target: Bus | JetStreamContext, config: api.StreamConfig) -> api.StreamInfo:
    """Create the stream, or update it to ``config``, in the bus's account or through another JetStream API."""
    js = target.js if isinstance(target, Bus) else target
    try:
        return await js.add_stream(config)
    except nats.js.errors.BadRequestError as exc:
        if exc.err_code != 10058:  # "stream name already in use with a different configuration"
            raise
        return await js.update_stream(config)


async def ensure_bank_federation(
    bus: Bus,
    role: Role,
    *domains: str,
    hub_domain: str = HUB_DOMAIN,
    peer_clusters: Sequence[str] | None = None,
) -> api.StreamInfo:
    """Create (or update to this definition) the sourcing stream of one server of the federation; idempotent.

    - ``role="hub"``: ``domains`` are the clusters' JetStream domains; creates ``IRSI_BANK_HUB``. Adding a
      cluster later = calling again with the longer list (existing sources keep their position).
    - ``role="leaf"``: ``domains`` is ignored (or the hub's domain, overriding ``hub_domain``); makes sure the
      local ``IRSI_BANK`` exists and creates ``IRSI_BANK_SHARED`` sourcing the hub, filtered to
      ``peer_clusters`` when given. On a cluster whose link has its own account (the module docstring), the
      link's two streams are made in ``BANK`` and the principals' ``IRSI_BANK_SHARED`` sources ``BANK``'s.

    ``bus`` must be connected to the server of that role (its own domain).
    """
    match role:
        case "hub":
            return await _put_stream(bus, hub_stream_config(domains, bus.replicas))
        case "leaf":
            if domains:
                hub_domain = domains[0]
            await bus.ensure_streams()
            shared = shared_stream_config(hub_domain, peer_clusters, bus.replicas)
            link = await _link_account(bus)
            if link is None:  # the link joins the principals' account (a server configured before BANK was)
                return await _put_stream(bus, shared)
            await _put_stream(link, bank_stream_config(bus.replicas))
            await _put_stream(link, shared)
            return await _put_stream(bus, _sourced_stream(
                SHARED_STREAM, "InfraRSI bank: other clusters' entries (sourced from the bank link's copy)",
                [api.StreamSource(name=SHARED_STREAM, external=api.ExternalStream(api=credentials.BANK_LINK_API))],
                bus.replicas))
        case _:
            raise ValueError(f"role must be 'hub' or 'leaf', not {role!r}")


def bank_stream_config(replicas: int) -> api.StreamConfig:
    """``IRSI_BANK`` as the bus defines it (``bank.>``): the principals' stream, and the link's copy of it."""
    [spec] = [spec for spec in STREAMS if spec.name == BANK_STREAM]
    return spec.config(replicas)


async def _link_account(bus: Bus) -> JetStreamContext | None:
    """The ``BANK`` account's JetStream as the principals reach it, or ``None`` where the server has no such
    account (nobody answers its API)."""
    link = bus.nc.jetstream(prefix=credentials.BANK_LINK_API, timeout=10.0)
    try:
        await link.account_info()
    except nats.errors.NoRespondersError:
        return None
    return link


# ------------------------------------------------------------------------------------------ server configs


def server_config_fragment(
    role: Role,
    *,
    domain: str,
    store_dir: Path | str,
    leaf_listen: str | None = None,
    hub_leaf_urls: Iterable[str] = (),
    hub_users: dict[str, str] | None = None,
    leaf_credentials: str | None = None,
) -> str:
    """The config blocks that make a server a federation member (appended to ``EmbeddedServer``'s config, whose
    own ``jetstream`` block it replaces — the later block wins). The files in ``deploy/nats/bank/`` hold the same.

    - hub: ``jetstream { domain: hub }`` and ``leafnodes { listen: <leaf_listen> }``. With ``hub_users`` (name →
      public nkey: each cluster's leaf link, the hub's operators; ``credentials.bank_account_block``) the hub
      requires credentials: a leaf or client without a listed key is refused, and every accepted connection is
      bound to the ``BANK`` account, whose JetStream holds only the bank.
    - leaf: ``jetstream { domain: <cluster> }`` and one remote to the hub, bound to the ``BANK`` account (the
      server must define it: ``EmbeddedServer.start(bank_link=True)``, ``credentials.cluster_accounts_block``)
      and denying ``bank.>``/``irsi.>`` both ways; ``leaf_credentials`` is the 0600 file with the link's seed
      (``credentials.ensure_leaf_link``), included in the remote block; nats-server resolves it from the
      config file's directory (a server over a data dir: ``credentials.LEAF_LINK_INCLUDE``).
    """
    deny = ", ".join(f'"{s}"' for s in LEAF_DENY_IMPORTS)
    deny_exports = ", ".join(f'"{s}"' for s in LEAF_DENY_EXPORTS)
    lines = [
        "jetstream {",
        f'  store_dir: "{store_dir}"',
        f"  domain: {domain}",
        "  max_memory_store: 256MB",
        "  max_file_store: 8GB",
        "}",
    ]
    if role == "hub":
        if not leaf_listen:
            raise ValueError("a hub needs leaf_listen (host:port for the clusters' leaf connections)")
        lines += ["leafnodes {", f"  listen: {leaf_listen}", "}"]
        if hub_users is not None:
            lines.append(credentials.bank_account_block(hub_users))
    else:
        urls = ", ".join(f'"{u}"' for u in hub_leaf_urls)
        auth = f', include "{leaf_credentials}"' if leaf_credentials is not None else ""
        if not urls:
            raise ValueError("a leaf needs the hub's leaf-node URL(s)")
        lines += [
            "leafnodes {",
            '  reconnect: "1s"',  # between attempts: a cluster cut off from the hub rejoins promptly
            "  remotes: [",
            f"    {{ urls: [{urls}], account: {credentials.BANK_ACCOUNT}, deny_imports: [{deny}], deny_exports: [{deny_exports}]{auth} }}",
            "  ]",
            "}",
        ]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------ reading


async def bank_streams(bus: Bus) -> list[str]:
    """The bank streams present on the connected server: local, shared, hub aggregate (in that order)."""
    present = []
    for name in (BANK_STREAM, SHARED_STREAM, HUB_STREAM):
        try:
            await bus.js.stream_info(name)
        except nats.js.errors.NotFoundError:
            continue
        present.append(name)
    return present


def _newer(a: ev.Event, b: ev.Event) -> bool:
    """Revision order of two events of the same entry: later ``ts``, then larger event id (deterministic)."""
    return (a.ts, a.event_id) > (b.ts, b.event_id)


def latest_by_entry(events: Iterable[ev.Event]) -> dict[str, ev.Event]:
    """One event per entry id: the latest revision, whatever order (or copies) the streams held them in."""
    out: dict[str, ev.Event] = {}
    for event in events:
        entry = event.payload
        if not isinstance(entry, ev.BankEntry):
            continue
        old = out.get(entry.entry_id)
        if old is None or _newer(event, old):
            out[entry.entry_id] = event
    return out


async def read_bank_events(bus: Bus, streams: Sequence[str] | None = None) -> list[ev.Event]:
    """Every bank event visible here, decoded (undecodable messages are skipped: they are dead letters)."""
    names = list(streams) if streams is not None else await bank_streams(bus)
    return [event for name in names async for event in bus.events(name)]


async def read_bank_entries(bus: Bus, streams: Sequence[str] | None = None) -> list[ev.BankEntry]:
    """The bank as this cluster sees it: local ∪ shared, one (latest) entry per ``entry_id``, sorted by id."""
    latest = latest_by_entry(await read_bank_events(bus, streams))
    return [entry for k in sorted(latest) if isinstance(entry := latest[k].payload, ev.BankEntry)]  # all are
