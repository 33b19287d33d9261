"""``infrarsi creds``: bus credentials for a deployment (deploy/nats/secure), or those of a data directory.

``infrarsi creds`` makes (or keeps) one nkey seed per principal under ``<data-dir>/creds`` — what ``infrarsi up``
does by itself — and writes ``<data-dir>/creds/auth.conf``, the ``authorization`` block a nats-server
``include``s. A deployment copies ``auth.conf`` next to its server configs and hands each process its own
seed file (``INFRARSI_NKEY_FILE=/run/secrets/launcher.nk``). Prints the principals, never a seed.

For the bank federation (deploy/nats/bank/secure): ``--leaf-link`` also makes the cluster's leaf-link seed and
``creds/leaf-link.conf``, the 0600 file its remote block includes, writes ``creds/accounts.conf`` (the cluster's
two accounts: the principals in ``IRSI``, the link in ``BANK``; ``credentials.cluster_accounts_block``), which the
cluster's config includes instead of ``auth.conf``, and prints the link's public key;
``--hub-user NAME=KEY`` (repeated: each cluster's link key) writes ``creds/bank-users.conf``, the hub's
``BANK`` account with those keys and this data directory's ``cli.bank`` (the hub's operator).
"""

from __future__ import annotations

import argparse
import json

from infrarsi.bus import credentials
from infrarsi.commands import data_dir_of
from infrarsi.errors import UserError

AUTH_CONF = "auth.conf"
ACCOUNTS_CONF = "accounts.conf"
BANK_USERS_CONF = "bank-users.conf"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print principal → public key as JSON")
    parser.add_argument("--leaf-link", action="store_true",
                        help="also make this cluster's leaf-link seed for the bank hub (creds/leaf-link.conf)")
    parser.add_argument("--hub-user", action="append", default=[], metavar="NAME=KEY",
                        help="a bank hub user (a cluster's leaf-link public key); writes creds/bank-users.conf")


def _hub_users(pairs: list[str]) -> dict[str, str]:
    users = {}
    for pair in pairs:
        name, _, key = pair.partition("=")
        if not name or not key.startswith("U") or len(key) != 56:
            raise UserError(f"--hub-user {pair!r}: expected NAME=KEY with a user public nkey (U…, 56 characters)")
        users[name] = key
    return users


async def run(args: argparse.Namespace) -> int:
    data_dir = data_dir_of(args)
    hub_users = _hub_users(args.hub_user)
    public = credentials.ensure(data_dir)
    conf = credentials.creds_dir(data_dir) / AUTH_CONF
    conf.write_text(credentials.authorization_block(public))
    out: dict[str, object] = {"auth_conf": str(conf), "principals": public}
    if args.leaf_link:
        out["leaf_link"], include = credentials.ensure_leaf_link(data_dir)
        out["leaf_link_conf"] = str(include)
        accounts = credentials.creds_dir(data_dir) / ACCOUNTS_CONF
        accounts.write_text(credentials.cluster_accounts_block(public))
        out["accounts_conf"] = str(accounts)
    if hub_users:
        bank_users = credentials.creds_dir(data_dir) / BANK_USERS_CONF
        bank_users.write_text(credentials.bank_account_block({"operator (cli.bank)": public["cli.bank"], **hub_users}))
        out["bank_users_conf"] = str(bank_users)
    if args.json:
        print(json.dumps(out))
    else:
        print(f"{len(public)} principals, seeds (mode 0600) and {AUTH_CONF} in {conf.parent}")
        for principal in sorted(public):
            print(f"  {principal:14} {public[principal]}")
        if args.leaf_link:
            print(f"leaf link to the bank hub: {out['leaf_link']} (seed included from {out['leaf_link_conf']}; "
                  f"the cluster's accounts in {out['accounts_conf']})")
        if hub_users:
            print(f"bank hub users ({len(hub_users)} + the operator) in {out['bank_users_conf']}")
    return 0
