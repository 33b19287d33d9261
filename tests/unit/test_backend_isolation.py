"""``backend.isolation`` and ``backend.read_only`` (the trial sandbox of the local and Slurm backends) as the
contract reads them, and the sandbox's command line: what is bound, what is not, and a bind that would expose the
launcher's state."""

from __future__ import annotations

from pathlib import Path

import pytest
from infrarsi.study.contract import BackendSpec
from infrarsi.trial import sandbox
from pydantic import ValidationError


def test_isolation_defaults_to_auto_and_takes_its_choices() -> None:
    assert BackendSpec().isolation == "auto"
    assert BackendSpec(isolation="sandbox", read_only=["/data/tokens"]).read_only == ["/data/tokens"]
    with pytest.raises(ValidationError, match="isolation"):
        BackendSpec(isolation="chroot")  # type: ignore[arg-type]


def test_read_only_inputs_must_be_absolute() -> None:
    with pytest.raises(ValidationError, match="read_only: 'data' is not an absolute path"):
        BackendSpec(read_only=["data"])


def test_isolation_is_the_local_and_slurm_backends_alone() -> None:
    assert BackendSpec(kind="slurm", isolation="sandbox", read_only=["/data"]).isolation == "sandbox"
    with pytest.raises(ValidationError, match="isolation do not apply to backend kind kubernetes"):
        BackendSpec(kind="kubernetes", image="img", isolation="sandbox")
    with pytest.raises(ValidationError, match="read_only do not apply to backend kind kubernetes"):
        BackendSpec(kind="kubernetes", image="img", read_only=["/data"])
    with pytest.raises(ValidationError, match="isolation do not apply to backend kind sim"):
        BackendSpec(kind="sim", isolation="none")


def test_the_command_line_binds_only_what_the_spec_names(tmp_path: Path) -> None:
    work, probe, data = tmp_path / "data" / "t" / "worktree", tmp_path / "data" / "t" / "probe", tmp_path / "data"
    spec = sandbox.SandboxSpec(workdir=work, writable=(probe,), read_only=(Path("/opt/env"), Path("/opt/env/lib")),
                               hidden=(data,))  # fmt: skip
    argv = sandbox.wrap(spec, ["python", "train.py"], bwrap="/usr/bin/bwrap")
    assert argv[-3:] == ["--", "python", "train.py"]
    binds = [(argv[i], argv[i + 1]) for i, a in enumerate(argv) if a in ("--bind", "--ro-bind")]
    assert binds == [("--ro-bind", "/opt/env"), ("--bind", str(work)), ("--bind", str(probe))]
    assert "--unshare-net" in argv and "--unshare-pid" in argv and argv[argv.index("--remount-ro") + 1] == "/"
    assert str(data) not in [argv[i + 1] for i, a in enumerate(argv) if a.endswith("bind")]
    assert "/etc/shadow" not in argv and "/etc" not in argv
    shared = sandbox.wrap(sandbox.SandboxSpec(workdir=work, private_network=False), ["x"], bwrap="/usr/bin/bwrap")
    assert "--unshare-net" not in shared


def test_a_bind_holding_a_hidden_path_is_refused(tmp_path: Path) -> None:
    spec = sandbox.SandboxSpec(workdir=tmp_path / "w", read_only=(tmp_path,), hidden=(tmp_path / "data",))
    with pytest.raises(sandbox.SandboxError, match=f"read-only input {tmp_path} contains {tmp_path / 'data'}"):
        sandbox.wrap(spec, ["x"], bwrap="/usr/bin/bwrap")
