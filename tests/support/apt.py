"""Install Debian packages a test needs with apt-get when their commands are missing, as root only; say why not
when that cannot be done. The Slurm, Prometheus and browser fixtures share it (``make *-deps`` do the same up front)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence


def install_reason(what: str, packages: Sequence[str], commands: Sequence[str], *, root_hint: str = "") -> str | None:
    """``apt-get install PACKAGES`` unless every one of ``commands`` is on PATH; ``None`` when they are there or the
    install succeeded, else why not (``what`` names the software, ``root_hint`` follows the needs-root reason)."""
    if all(shutil.which(cmd) for cmd in commands):
        return None
    if os.geteuid() != 0:
        return f"{what} is not installed and installing it (apt-get) needs root{root_hint}"
    if shutil.which("apt-get") is None:
        return f"{what} is not installed and there is no apt-get to install it"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-q"],
                 ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]):
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=900)
        if proc.returncode != 0 and argv[1] == "install":
            return f"apt-get install {' '.join(packages)} failed: {proc.stderr.strip()[-300:]}"
    return None
