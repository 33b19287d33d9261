"""Who may read the dashboard: anyone on this host when it listens on loopback; beyond it, only a holder of the
dashboard's token, over TLS — the bus's model (a secret file per reader under ``<data-dir>/creds/``, 0600; TLS
to clients; nothing served to a caller without credentials). Pure checks, no server."""

from __future__ import annotations

import base64
import binascii
import ipaddress
import secrets
import socket
from dataclasses import dataclass

TOKEN_FILE = "dashboard.token"
"""Under ``<data-dir>/creds/``: the bearer token readers beyond loopback present (``credentials.ensure_token``)."""
COOKIE = "infrarsi_dashboard"
"""Set by ``/?token=…`` so that the page's own requests (fetch, server-sent events) carry the token."""


class AccessError(ValueError):
    """A listening address and credentials that do not go together (exit 2)."""


def is_loopback(host: str) -> bool:
    """``host`` names only this machine's loopback (``127.0.0.1``, ``::1``, ``localhost``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return all(ipaddress.ip_address(info[4][0]).is_loopback for info in socket.getaddrinfo(host, None))
        except (socket.gaierror, ValueError):
            return False


@dataclass(frozen=True)
class Access:
    """What a request must carry: nothing (``token`` ``None``: loopback) or the token."""

    token: str | None

    def allows(self, authorization: str | None, cookie: str | None, query_token: str | None) -> bool:
        """The request presents the token as ``Authorization: Bearer``, HTTP Basic (any user, the token as the
        password), the dashboard's cookie, or ``?token=``; compared in constant time."""
        if self.token is None:
            return True
        offered = [cookie, query_token]
        if authorization:
            scheme, _, value = authorization.partition(" ")
            if scheme.lower() == "bearer":
                offered.append(value.strip())
            elif scheme.lower() == "basic":
                try:
                    offered.append(base64.b64decode(value.strip(), validate=True).decode().partition(":")[2])
                except (binascii.Error, UnicodeDecodeError):
                    pass
        return any(o is not None and secrets.compare_digest(o.encode(), self.token.encode()) for o in offered)


def check_listen(host: str, tls: bool, token: str | None) -> None:
    """Refuse to serve beyond loopback without TLS or without a token (the message says which is missing)."""
    if is_loopback(host):
        return
    missing = [what for what, ok in (("--tls-cert and --tls-key", tls), ("a token", token is not None)) if not ok]
    if missing:
        raise AccessError(
            f"--host {host} is beyond loopback: the dashboard serves it only with {' and '.join(missing)} "
            "(docs/dashboard.md, 'Beyond loopback')"
        )
