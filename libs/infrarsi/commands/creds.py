"""``infrarsi creds``: bus credentials for a deployment (deploy/nats/secure), or those of a data directory.

``infrarsi creds`` makes (or keeps) one nkey seed per principal under ``<data-dir>/creds`` — what ``infrarsi up``
does by itself — and writes ``<data-dir>/creds/auth.conf``, the ``authorization`` block a nats-server
``include``s. A deployment copies ``auth.conf`` next to its server configs and hands each process its own
seed file (``INFRARSI_NKEY_FILE=/run/secrets/launcher.nk``). Prints the principals, never a seed.
"""

from __future__ import annotations

import argparse
import json

from infrarsi import credentials
from infrarsi.commands import data_dir_of

AUTH_CONF = "auth.conf"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print principal → public key as JSON")


async def run(args: argparse.Namespace) -> int:
    data_dir = data_dir_of(args)
    public = credentials.ensure(data_dir)
    conf = credentials.creds_dir(data_dir) / AUTH_CONF
    conf.write_text(credentials.authorization_block(public))
    if args.json:
        print(json.dumps({"auth_conf": str(conf), "principals": public}))
    else:
        print(f"{len(public)} principals, seeds (mode 0600) and {AUTH_CONF} in {conf.parent}")
        for principal in sorted(public):
            print(f"  {principal:14} {public[principal]}")
    return 0
