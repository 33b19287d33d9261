"""Bus credentials: one NATS nkey per principal, and the server's authorization block built from them.

Owns where credentials live (``<data_dir>/creds/<principal>.nk``, the seed, mode 0600 in a 0700 directory),
making them (``ensure``), how a connection finds its own (``for_principal``: ``$INFRARSI_NKEY_FILE`` first —
how a trial job or a deployed service is handed one — else the data directory's file for its name), and the
``authorization { users = [...] }`` block a nats-server loads: each principal's public key with the subjects
``infrarsi.bus.subjects.permissions`` gives it, plus the JetStream API, ack and inbox subjects its reading and
publishing need, scoped to the streams it uses. ``admin`` (the stack itself and operators) has every right.

What a permission cannot say: a JetStream pull consumer delivers through the reader's inbox, so reading is
scoped per *stream* (the streams holding the types a principal consumes), not per event type. docs/security.md
lists this and the rest of what is not protected.

Secrets never leave the seed files: events, logs and environment variables carry paths only.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infrarsi.bus import subjects

CREDS_DIR = "creds"
NKEY_FILE_ENV = "INFRARSI_NKEY_FILE"
"""A path to one principal's seed file: set by the launcher for a trial job, or by a deployment."""
ADMIN = "admin"
"""The stack's own principal (creates streams, pings services) and an operator's: every right."""
SEED_SUFFIX = ".nk"
STREAMS = (subjects.LIFECYCLE_STREAM, subjects.TELEMETRY_STREAM, subjects.BANK_STREAM)
BANK_STREAMS = (subjects.BANK_STREAM, subjects.BANK_SHARED_STREAM, subjects.BANK_HUB_STREAM)
"""Where bank entries are read: the local stream and, with federation (docs/bank.md), the other clusters'
entries sourced into ``IRSI_BANK_SHARED`` (on a cluster) or ``IRSI_BANK_HUB`` (on the hub)."""
FEDERATES = "cli.bank"
"""The principal that creates and updates the federation's sourcing streams (``infrarsi bank federate``)."""
READ_ONLY_API = (
    "$JS.API.INFO",
    "$JS.API.STREAM.NAMES",
    "$JS.API.STREAM.LIST",
    "$JS.API.STREAM.INFO.*",
    "$JS.API.CONSUMER.NAMES.*",
    "$JS.API.CONSUMER.LIST.*",
    "$JS.API.CONSUMER.INFO.*.*",
)
"""Metadata every principal may ask for (``infrarsi status`` shows stream and consumer counts): no content."""


@dataclass(frozen=True)
class Credentials:
    """How one principal connects: its seed file and the inbox prefix its permissions allow."""

    principal: str
    seed_file: Path

    @property
    def inbox_prefix(self) -> str:
        return inbox_prefix(self.principal)

    # ``Any`` values: spread into ``connect(**...)`` beside other keywords, each of its own type.
    def connect_options(self) -> dict[str, Any]:
        """The nats-py ``connect`` keyword arguments."""
        return {"nkeys_seed": str(self.seed_file), "inbox_prefix": self.inbox_prefix}


TLS_CA_ENV = "INFRARSI_NATS_CA"
"""A CA file to verify a TLS server with (deploy/nats/secure signs its servers with its own CA)."""


def tls_options() -> dict[str, Any]:
    """nats-py ``connect`` arguments for a server with TLS: a context trusting ``$INFRARSI_NATS_CA``, if set."""
    import ssl

    ca = os.environ.get(TLS_CA_ENV)
    return {"tls": ssl.create_default_context(cafile=ca)} if ca else {}


def inbox_prefix(principal: str) -> str:
    """A principal's own reply subjects (``_INBOX_<name>.…``): nobody else may subscribe to them."""
    return "_INBOX_" + "".join(c if c.isalnum() else "_" for c in principal)


def creds_dir(data_dir: Path | str) -> Path:
    return Path(data_dir) / CREDS_DIR


def all_principals() -> tuple[str, ...]:
    return (ADMIN, *subjects.principals())


def _principal_of(seed_file: Path) -> str:
    return seed_file.name.removesuffix(SEED_SUFFIX)


def ensure(data_dir: Path | str) -> dict[str, str]:
    """Make a seed for every principal that has none under ``data_dir``; return principal → public key.

    Existing seeds are kept, so a restarted server accepts the services still holding them.
    """
    directory = _private_dir(data_dir)
    return {principal: _ensure_seed(directory / f"{principal}{SEED_SUFFIX}") for principal in all_principals()}


def _private_dir(data_dir: Path | str) -> Path:
    directory = creds_dir(data_dir)
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    return directory


def _write_private(path: Path, data: bytes) -> None:
    # Created 0600 before the secret is written: never readable by others, even for an instant.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def _ensure_seed(path: Path) -> str:
    """The public key of the user seed at ``path``, made first if there is none."""
    import nkeys

    if not path.exists():
        _write_private(path, nkeys.encode_seed(secrets.token_bytes(32), nkeys.PREFIX_BYTE_USER))
    public: str = nkeys.from_seed(path.read_bytes().strip()).public_key.decode()
    return public


def ensure_token(data_dir: Path | str, name: str) -> str:
    """A random bearer token kept in ``<data-dir>/creds/<name>`` (0600, made on first use like a seed): what a
    reader of the dashboard beyond loopback must present. Existing tokens are kept."""
    path = _private_dir(data_dir) / name
    if not path.exists():
        _write_private(path, secrets.token_urlsafe(32).encode())
    return path.read_text().strip()


LEAF_SEED = "leaf-link"
"""The seed a cluster's server authenticates its leaf link to the bank hub with (not a bus principal)."""
LEAF_REMOTE_CONF = "leaf-link.conf"
"""``nkey: "<seed>"`` for the leaf remote block to ``include`` (0600): the server config itself holds no secret."""
LEAF_LINK_INCLUDE = f"{CREDS_DIR}/{LEAF_REMOTE_CONF}"
"""The include path from a server config written in the data directory (nats-server resolves includes from the
config file's directory, absolute paths too)."""


def ensure_leaf_link(data_dir: Path | str) -> tuple[str, Path]:
    """The leaf link's public key (to list among the hub's bank users) and the 0600 file its remote includes.

    ``<data_dir>/creds/leaf-link.nk`` is made once and kept; the include file is written from it.
    """
    directory = _private_dir(data_dir)
    public = _ensure_seed(directory / f"{LEAF_SEED}{SEED_SUFFIX}")
    include = directory / LEAF_REMOTE_CONF
    if not include.exists():
        seed = (directory / f"{LEAF_SEED}{SEED_SUFFIX}").read_bytes().strip()
        _write_private(include, b'nkey: "%s"\n' % seed)
    return public, include


def for_principal(principal: str, data_dir: Path | str | None) -> Credentials | None:
    """The credentials ``principal`` connects with, or ``None`` when there are none (a server without auth).

    ``$INFRARSI_NKEY_FILE`` wins (a job or a deployed process is handed exactly one); otherwise
    ``<data_dir>/creds/<principal>.nk`` if it exists.
    """
    explicit = os.environ.get(NKEY_FILE_ENV)
    if explicit:
        return Credentials(_principal_of(Path(explicit)), Path(explicit))
    return stored(principal, data_dir) if data_dir is not None else None


def stored(principal: str, data_dir: Path | str) -> Credentials | None:
    """``principal``'s credentials under ``data_dir``, if a stack made them (what the launcher hands a job)."""
    path = creds_dir(data_dir) / f"{principal}{SEED_SUFFIX}"
    return Credentials(principal, path) if path.exists() else None


def has_credentials(data_dir: Path | str) -> bool:
    """Whether a server over ``data_dir`` runs with authorization (a stack made credentials there)."""
    return (creds_dir(data_dir) / f"{ADMIN}{SEED_SUFFIX}").exists()


# --------------------------------------------------------------------------------------------------
# Server side
# --------------------------------------------------------------------------------------------------


def _streams_of(filters: Iterable[str]) -> set[str]:
    """The streams holding the subjects of ``filters`` (telemetry, bank, or the lifecycle stream)."""
    out = set()
    for subject in filters:
        if subject.startswith(subjects.telemetry_subject("", "")[:-2]):
            out.add(subjects.TELEMETRY_STREAM)
        elif subject.startswith(f"{subjects.BANK_ROOT}."):
            out.update(BANK_STREAMS)
        elif subject.startswith(f"{subjects.ROOT}.") and not subjects.is_deadletter(subject):
            out.add(subjects.LIFECYCLE_STREAM)
    return out


def nats_permissions(principal: str) -> dict[str, object]:
    """The nats-server ``permissions`` block of one principal (``subjects.permissions`` plus JetStream's needs).

    - publish: the event subjects it owns; creating a stream with InfraRSI's definition (a no-op on an existing
      stream — it cannot update, purge or delete one), and for ``cli.bank`` creating and updating the bank
      federation's sourcing streams; stream and consumer metadata; for each stream it reads (reading the bank
      means every bank stream: local, shared, hub),
      the consumer API (create, next, delete), direct gets and acks; replies to requests it received
      (``allow_responses``: pings).
    - subscribe: the event subjects it reads (core subscriptions) and its own inbox (JetStream replies and
      pull deliveries arrive there).
    """
    table = subjects.permissions(principal)
    publish = set(table.publish) | set(READ_ONLY_API)
    publish |= {f"$JS.API.STREAM.CREATE.{s}" for s in STREAMS}
    if principal == FEDERATES:
        federation = (subjects.BANK_SHARED_STREAM, subjects.BANK_HUB_STREAM)
        publish |= {f"$JS.API.STREAM.{verb}.{s}" for s in federation for verb in ("CREATE", "UPDATE")}
        publish |= {s for s in _link_api(BANK_LINK_API) if ".CONSUMER." not in s}  # the link's streams
    for stream in sorted(_streams_of(table.subscribe)):
        publish |= {
            f"$JS.API.CONSUMER.CREATE.{stream}",
            f"$JS.API.CONSUMER.CREATE.{stream}.>",
            f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.*",
            f"$JS.API.CONSUMER.MSG.NEXT.{stream}.*",
            f"$JS.API.CONSUMER.DELETE.{stream}.*",
            f"$JS.API.DIRECT.GET.{stream}",
            f"$JS.API.DIRECT.GET.{stream}.>",
            f"$JS.API.STREAM.MSG.GET.{stream}",
            f"$JS.ACK.{stream}.>",
        }
    subscribe = set(table.subscribe) | {f"{inbox_prefix(principal)}.>"}
    return {
        "publish": {"allow": sorted(publish)},
        "subscribe": {"allow": sorted(subscribe)},
        "allow_responses": True,
    }


BANK_ACCOUNT = "BANK"
"""The account of the bank's leaf links, on both ends: the hub's one account, where every cluster's link is bound,
and on each cluster the account the link's remote binds to (``cluster_accounts_block``). Its JetStream holds only
the bank."""


def bank_account_block(users: dict[str, str]) -> str:
    """The hub's ``accounts { BANK { ... } }``: name → public key of everyone who may connect (clusters' leaf
    links, the hub's operators). With it, the hub refuses any connection — client or leaf — without one of
    these keys, and binds every accepted one to ``BANK`` (nothing else exists on the hub)."""
    if not users:
        raise ValueError("the bank hub needs at least one user (a cluster's leaf link)")
    listed = ",\n".join(f"      # {name}\n      {json.dumps({'nkey': key})}" for name, key in sorted(users.items()))
    return f"accounts {{\n  {BANK_ACCOUNT} {{\n    jetstream: enabled\n    users = [\n{listed}\n    ]\n  }}\n}}\n"


def _users(public_keys: dict[str, str], indent: str) -> str:
    """The ``users = [...]`` list of the principals (JSON values are valid nats-server config)."""
    users = []
    for principal in sorted(public_keys):
        user: dict[str, object] = {"nkey": public_keys[principal]}
        if principal != ADMIN:
            user["permissions"] = nats_permissions(principal)
        users.append(f"{indent}  # {principal}\n{indent}  {json.dumps(user)}")
    return f"{indent}users = [\n" + ",\n".join(users) + f"\n{indent}]\n"


def authorization_block(public_keys: dict[str, str]) -> str:
    """The ``authorization { users = [...] }`` text for a nats-server config."""
    return "authorization {\n" + _users(public_keys, "  ") + "}\n"


# --------------------------------------------------------------------------------------------------
# A federated cluster: the principals' account and the bank link's account (docs/security.md)
# --------------------------------------------------------------------------------------------------

PRINCIPALS_ACCOUNT = "IRSI"
"""On a cluster of the bank federation, the account of every principal (services, CLI verbs, jobs)."""
BANK_LINK_API = "$JS.bank-link.API"
"""How a federated cluster's principals reach its ``BANK`` account's JetStream: the slice of that API the
principals' account imports (``cluster_accounts_block``). A prefix like a JetStream domain's, so no cluster or
hub may take ``bank-link`` as its domain."""
ANONYMOUS = "anonymous"
"""A cluster without credentials maps every client to this user of the principals' account (``no_auth_user``)."""
LINK_STREAMS = (subjects.BANK_STREAM, subjects.BANK_SHARED_STREAM)
"""The streams of a cluster's ``BANK`` account: the copy of the cluster's entries the hub sources, and the
other clusters' entries sourced from the hub (which the principals' own ``IRSI_BANK_SHARED`` sources)."""


def _link_api(api: str = "$JS.API") -> list[str]:
    """The ``BANK`` JetStream API subjects the principals' account may call (under ``api``): create, update and
    inspect the link's two streams, account info, and create the consumer that sources the shared copy."""
    shared = subjects.BANK_SHARED_STREAM
    return [f"{api}.INFO",
            *(f"{api}.STREAM.{verb}.{s}" for s in LINK_STREAMS for verb in ("CREATE", "UPDATE", "INFO")),
            f"{api}.CONSUMER.CREATE.{shared}", f"{api}.CONSUMER.CREATE.{shared}.>"]


def cluster_accounts_block(public_keys: dict[str, str] | None) -> str:
    """A bank-federation cluster's ``accounts``: the principals in ``IRSI``, the leaf link in ``BANK``.

    ``IRSI`` holds the principals with the permissions ``authorization_block`` gives them (without
    ``public_keys``: one user every client without credentials is mapped to) and the cluster's own streams.
    ``BANK``, to which the leaf remote binds (``account: BANK``), has its own JetStream with only the link's
    streams (``LINK_STREAMS``): whatever arrives over the link — the hub's requests to
    ``$JS.<cluster domain>.API``, a publish, a subscription — lives in ``BANK`` and reaches nothing of ``IRSI``.
    What crosses between them, and only this:

    - ``IRSI`` → ``BANK``: the core messages on ``bank.>`` (a stream export): each entry a principal publishes
      is stored by ``IRSI``'s ``IRSI_BANK`` (the publisher's ack) and by ``BANK``'s, which the hub sources;
    - ``BANK`` → ``IRSI``: the slice of ``BANK``'s JetStream API in ``_link_api`` (imported under
      ``BANK_LINK_API``: ``infrarsi bank federate`` creates the link's streams, and ``IRSI``'s
      ``IRSI_BANK_SHARED`` sources ``BANK``'s), the sourcing consumer's deliveries (``$JS.S.>``) and the flow
      control it asks to be answered (``$JS.FC.IRSI_BANK_SHARED.>``).

    (Sourcing the other way too would export ``$JS.S.>`` both ways, which nats-server refuses as a cycle.)
    """
    if public_keys:
        users, anonymous = _users(public_keys, "    "), ""
    else:  # a password nobody uses: clients without credentials are mapped to the user by no_auth_user
        users = f"    users = [{json.dumps({'user': ANONYMOUS, 'password': secrets.token_hex(16)})}]\n"
        anonymous = f"no_auth_user: {ANONYMOUS}\n"
    bank, irsi = BANK_ACCOUNT, PRINCIPALS_ACCOUNT
    fc = f"$JS.FC.{subjects.BANK_SHARED_STREAM}.>"
    bank_exports: list[dict[str, object]] = [{"service": s, "accounts": [irsi]} for s in _link_api()]
    bank_exports += [{"stream": "$JS.S.>", "accounts": [irsi]}, {"service": fc, "accounts": [irsi]}]
    irsi_imports: list[dict[str, object]] = [
        {"service": {"account": bank, "subject": s}, "to": to} for s, to in zip(_link_api(), _link_api(BANK_LINK_API),
                                                                               strict=True)]
    irsi_imports += [{"stream": {"account": bank, "subject": "$JS.S.>"}}, {"service": {"account": bank, "subject": fc}}]

    def listed(name: str, items: list[dict[str, object]]) -> str:
        return f"    {name} = [\n" + "".join(f"      {json.dumps(item)}\n" for item in items) + "    ]\n"

    return (
        f"{anonymous}accounts {{\n"
        f"  {irsi} {{\n    jetstream: enabled\n{users}"
        + listed("exports", [{"stream": f"{subjects.BANK_ROOT}.>", "accounts": [bank]}])
        + listed("imports", irsi_imports)
        + f"  }}\n  {bank} {{\n    jetstream: enabled\n"
        + listed("exports", bank_exports)
        + listed("imports", [{"stream": {"account": irsi, "subject": f"{subjects.BANK_ROOT}.>"}}])
        + "  }\n}\n"
    )


def server_auth(public_keys: dict[str, str] | None, *, bank_link: bool = False) -> str:
    """The auth text of a server: ``authorization`` with the principals (none without keys), or on a cluster of
    the bank federation (``bank_link``) the two accounts of ``cluster_accounts_block``."""
    if bank_link:
        return cluster_accounts_block(public_keys)
    return authorization_block(public_keys) if public_keys else ""
