"""The trial sandbox: a job's command wrapped in bubblewrap (``bwrap``), so untrusted trial code sees only what
it needs.

Owns what a sandboxed job may see and how that is spelled as a ``bwrap`` command line. Inside the sandbox:

- its worktree and its probe directory, writable (the only places it can write that outlive it);
- its read-only inputs: the Python environment (``sys.prefix``, ``sys.base_prefix``, the directory InfraRSI
  itself is imported from, for the probe), an installed tool's own virtual environment when the command names
  the tool by its path (``program_inputs``), the launch file, and the paths the contract declares
  (``backend.read_only``: data sets, caches);
- the system's programs and libraries (``/usr``, ``/bin``, ``/lib*``), a few files of ``/etc`` (users, hosts,
  the dynamic linker's cache, certificates; not host keys, not ``/etc/shadow``), ``/sys`` read-only, its own
  ``/proc`` (a new PID namespace: no other process's environment or root directory) and ``/dev``;
- a private ``/tmp`` (a tmpfs, gone with the job); ``HOME`` is ``/tmp``;
- everything else is absent; the root itself is read-only, so a write outside the binds fails (``EROFS``).

The job holds no secret: the launcher relays its probe records onto the bus (services/launcher), so no seed and
no bus address are handed in. Network: a job of one node gets its own network namespace (only loopback: no
port of the host, the bus included, can be reached); the agents of a multi-node job need each other, so they
keep the network they are started in — the host's on loopback, or their emulated host's (``infrarsi.trial.netns``).

Run as root (this project's test machines), the job also loses every capability (``--cap-drop ALL``); as
another user, bwrap uses an unprivileged user namespace. This module does no I/O beyond looking for ``bwrap``
and a one-off check that it can start a sandbox here.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

Isolation = Literal["auto", "sandbox", "none"]
"""What a contract asks for (``backend.isolation``): ``sandbox`` — bwrap, and a trial that cannot have it is
refused; ``auto`` — bwrap where this host has it, else none, said in ``TrialLaunched.isolation`` and the log;
``none`` — the job runs as the launcher's own process would (it can read everything the launcher can)."""

SANDBOXED = "bwrap"
"""``TrialLaunched.isolation`` of a job that ran in the sandbox."""
UNISOLATED = "none"
"""``TrialLaunched.isolation`` of a job that ran without one."""

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/opt")
ETC_FILES = (
    "/etc/passwd", "/etc/group", "/etc/hosts", "/etc/hostname", "/etc/nsswitch.conf", "/etc/resolv.conf",
    "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/ssl", "/etc/ca-certificates",
    "/etc/alternatives", "/etc/os-release", "/etc/debian_version", "/etc/mime.types", "/etc/gai.conf",
)  # fmt: skip
"""What of ``/etc`` a Python training job reads; the rest (host keys, shadow, the services' configs) stays out."""


class SandboxError(Exception):
    """The sandbox cannot be built as asked (a read-only input that would expose the launcher's state)."""


@dataclass(frozen=True)
class SandboxSpec:
    """What one job may see, besides the system (see the module docstring)."""

    workdir: Path
    """The job's worktree: writable, and its working directory."""
    writable: tuple[Path, ...] = ()
    """Further writable directories (the probe directory)."""
    read_only: tuple[Path, ...] = ()
    """Read-only inputs (the Python environment, the launch file, the contract's ``backend.read_only``)."""
    private_network: bool = True
    """Its own network namespace (loopback only); ``False`` for the agents of a multi-node job."""
    hidden: tuple[Path, ...] = field(default=())
    """Paths no read-only input may contain (the launcher's state root, the data directory)."""


def python_inputs() -> tuple[Path, ...]:
    """The Python environment a job started with this interpreter needs: the venv, the base install, and the
    directory ``infrarsi`` is imported from (an editable install lives outside the venv)."""
    import infrarsi

    package_parent = Path(infrarsi.__file__).resolve().parent.parent
    paths = {Path(sys.prefix), Path(sys.base_prefix), package_parent}
    return tuple(sorted({p.resolve() for p in paths}))


def program_inputs(argv: Sequence[str]) -> tuple[Path, ...]:
    """What the job's program needs when it is an installed tool named by its absolute path outside the system
    directories (``/opt/tools/.venv/bin/litgpt``): its virtual environment and the Python that environment was
    made from (``home`` in its ``pyvenv.cfg``), or else the program file alone. ``()`` for anything else."""
    if not argv or not os.path.isabs(argv[0]):
        return ()
    program = Path(argv[0])
    if any(_inside(program, Path(d)) for d in SYSTEM_DIRS) or not program.is_file():
        return ()
    environment = program.parent.parent
    config = environment / "pyvenv.cfg"
    if program.parent.name != "bin" or not config.is_file():
        return (program,)
    paths = [environment]
    for line in config.read_text(errors="replace").splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home" and value.strip():
            paths.append(Path(value.strip()).parent)  # ``home`` is the base install's bin/
    return tuple(paths)


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


@functools.cache
def unavailable_reason() -> str | None:
    """Why a sandbox cannot be started here (``None`` when it can): no ``bwrap``, or the kernel refuses the
    namespaces it needs (a container without user namespaces, a seccomp profile)."""
    bwrap = bwrap_path()
    if bwrap is None:
        return "bubblewrap (`bwrap`) is not installed (`make sandbox-deps`, or apt-get install bubblewrap)"
    trial = wrap(SandboxSpec(workdir=Path("/"), read_only=()), ["/bin/true"], bwrap=bwrap, check_inputs=False)
    try:
        done = subprocess.run(trial, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"bwrap cannot start here: {exc}"
    if done.returncode != 0:
        return f"bwrap cannot start a sandbox here: {done.stderr.strip()[:300] or f'exit {done.returncode}'}"
    return None


def _inside(path: Path, parent: Path) -> bool:
    return path == parent or parent in path.parents


def check(spec: SandboxSpec) -> None:
    """Refuse a bind that contains a hidden path (``SandboxError``, naming both): binding it would hand the job
    the launcher's state and the data directory's seeds."""
    binds = [("read-only input", p) for p in spec.read_only]
    binds += [("writable directory", p) for p in (spec.workdir, *spec.writable)]
    for kind, source in binds:
        resolved = source.resolve()
        for hidden in spec.hidden:
            if _inside(hidden.resolve(), resolved):
                raise SandboxError(f"{kind} {source} contains {hidden}, which a trial must not see")


def wrap(
    spec: SandboxSpec, argv: list[str], *, bwrap: str | None = None, check_inputs: bool = True
) -> list[str]:
    """``argv`` run inside the sandbox ``spec`` describes: the ``bwrap`` command line (no shell)."""
    if check_inputs:
        check(spec)
    binary = bwrap or bwrap_path()
    if binary is None:
        raise SandboxError("bubblewrap (`bwrap`) is not installed")
    # No --die-with-parent: a sandboxed job outlives a killed launcher as an unsandboxed one does, so the
    # restarted launcher finds it by its launch tag and reaps it (or reattaches), as docs/trials.md says
    out = [binary, "--new-session", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
           "--unshare-cgroup-try"]  # fmt: skip
    if spec.private_network:
        out.append("--unshare-net")
    if os.geteuid() == 0:
        out += ["--cap-drop", "ALL"]
    for directory in SYSTEM_DIRS:
        out += _bind("--ro-bind-try", Path(directory))
    for etc in ETC_FILES:
        out += _bind("--ro-bind-try", Path(etc))
    out += ["--ro-bind-try", "/sys", "/sys", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    for path in _outermost(spec.read_only):
        out += _bind("--ro-bind", path)
    for path in (spec.workdir, *spec.writable):
        out += _bind("--bind", path)
    out += ["--remount-ro", "/", "--chdir", str(spec.workdir), "--setenv", "HOME", "/tmp", "--setenv", "TMPDIR", "/tmp"]
    return [*out, "--", *argv]


def _bind(flag: str, path: Path) -> list[str]:
    # Symlinks (merged /usr: /bin → usr/bin) are bound at their own name, resolved.
    return [flag, str(path.resolve() if path.is_symlink() else path), str(path)]


def _outermost(paths: Iterable[Path]) -> list[Path]:
    """``paths`` without those inside another of them (binding both would shadow nothing, but costs a mount)."""
    resolved = sorted({p.resolve() for p in paths}, key=lambda p: len(p.parts))
    kept: list[Path] = []
    for path in resolved:
        if not any(_inside(path, k) for k in kept):
            kept.append(path)
    return kept
