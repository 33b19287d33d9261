"""OpenSSH signatures: sign a statement with a key, verify it against an allowed-signers list.

Owns the two ``ssh-keygen -Y`` calls InfraRSI makes (the same mechanism git uses for SSH-signed commits)
and nothing else: what is signed, and what a verified signature means, belong to the caller
(``infrarsi.verdicts.approvals``). Keys and allowed-signers files are OpenSSH's own formats, so a team reuses the
keys and the allowed-signers file it already has for signed commits.

A signature is bound to a *namespace* (``-n``) so that a signature made for one purpose (an approval) is
never valid for another (a git commit, a file signature).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

APPROVAL_NAMESPACE = "infrarsi-approval"
SIGN_TIMEOUT_S = 30.0
"""ssh-keygen may ask an agent or a hardware key; never wait on it forever."""


class SigningError(Exception):
    """A statement could not be signed (no ssh-keygen, unreadable key, key with a passphrase and no agent)."""


def _ssh_keygen() -> str:
    path = shutil.which("ssh-keygen")
    if path is None:
        raise SigningError("ssh-keygen not found on PATH (install OpenSSH ≥ 8.1 to sign or verify approvals)")
    return path


def sign(statement: bytes, key: Path | str, namespace: str = APPROVAL_NAMESPACE) -> str:
    """The armored ``SSH SIGNATURE`` of ``statement`` made with the private ``key`` (a file path)."""
    key = Path(key).expanduser()
    if not key.is_file():
        raise SigningError(f"signing key {key} not found")
    try:
        result = subprocess.run(
            [_ssh_keygen(), "-q", "-Y", "sign", "-f", str(key), "-n", namespace],
            input=statement,
            capture_output=True,
            timeout=SIGN_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        raise SigningError(f"ssh-keygen did not sign within {SIGN_TIMEOUT_S:.0f} s (passphrase prompt?)") from None
    if result.returncode != 0:
        detail = result.stderr.decode(errors="replace").strip()
        raise SigningError(f"ssh-keygen could not sign with {key}: {detail}")
    return result.stdout.decode()


def verify(
    statement: bytes,
    signature: str,
    principal: str,
    allowed_signers: Sequence[str],
    namespace: str = APPROVAL_NAMESPACE,
) -> str | None:
    """Why ``signature`` is not a valid signature of ``statement`` by ``principal``; ``None`` if it is.

    ``allowed_signers`` are the lines of an OpenSSH allowed-signers file (``principal [options] key``);
    their ``valid-before``/``valid-after`` and ``namespaces`` options are honoured by ssh-keygen.
    """
    if not signature.strip():
        return "unsigned"
    with tempfile.TemporaryDirectory(prefix="infrarsi-verify-") as scratch:
        signers = Path(scratch) / "allowed_signers"
        signers.write_text("".join(f"{line}\n" for line in allowed_signers))
        sig = Path(scratch) / "statement.sig"
        sig.write_text(signature)
        try:
            result = subprocess.run(
                [_ssh_keygen(), "-Y", "verify", "-f", str(signers), "-I", principal, "-n", namespace, "-s", str(sig)],
                input=statement,
                capture_output=True,
                timeout=SIGN_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            return f"ssh-keygen did not verify within {SIGN_TIMEOUT_S:.0f} s"
    if result.returncode == 0:
        return None
    detail = (result.stderr or result.stdout).decode(errors="replace").strip().splitlines()
    return f"signature does not verify for {principal!r} ({detail[-1] if detail else 'ssh-keygen refused it'})"


def public_key_line(key: Path | str) -> str:
    """The public half of a private key file, as ``ssh-keygen -y`` prints it (for allowed-signers lines)."""
    result = subprocess.run(
        [_ssh_keygen(), "-y", "-f", str(Path(key).expanduser())],
        capture_output=True,
        text=True,
        timeout=SIGN_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )
    if result.returncode != 0:
        raise SigningError(f"cannot read the public key of {key}: {result.stderr.strip()}")
    return result.stdout.strip()
