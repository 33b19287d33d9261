"""How the CLI reports what the user can fix: one exit code per kind of failure (``infrarsi.errors``), the same
``no NATS server`` answer from every verb that needs a server, and nothing written before it fails."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from infrarsi import cli, errors
from infrarsi.errors import UserError

NO_SERVER_VERBS = (
    ["status"],
    ["events", "tail"],
    ["doctor", "s1"],
    ["run", "s1"],
    ["verify", "s1"],
    ["model", "s1"],
    ["report", "s1", "--out", "{out}"],
    ["bank", "list"],
    ["dashboard", "--port", "0"],
)


def test_exit_codes_are_one_per_kind() -> None:
    codes = [errors.EXIT_OK, errors.EXIT_FAILED, errors.EXIT_USAGE, errors.EXIT_REFUSED, errors.EXIT_TIMEOUT,
             errors.EXIT_INTERRUPTED]
    assert len(set(codes)) == len(codes)


@pytest.mark.parametrize("argv", NO_SERVER_VERBS, ids=lambda a: " ".join(a[:2]))
def test_every_verb_that_needs_a_server_says_so_the_same_way(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("INFRARSI_NATS_URL", raising=False)
    out = tmp_path / "report-out"
    code = cli.main(["--data-dir", str(tmp_path / "data"), *[a.format(out=out) for a in argv]])
    err = capsys.readouterr().err
    assert code == errors.EXIT_USAGE, err
    assert err.startswith("error: no NATS server") and len(err.strip().splitlines()) == 1, err
    assert not out.exists(), "a verb that cannot reach the bus must not leave its --out directory behind"
    assert not (tmp_path / "data").exists(), "nor start a server"


async def test_invoke_prints_the_message_and_details_and_returns_the_code(capsys: pytest.CaptureFixture[str]) -> None:
    async def refuses(args: argparse.Namespace) -> int:
        raise UserError("c1: not applied", errors.EXIT_REFUSED, details=["refused: needs an approval"])

    assert await cli.invoke(refuses, argparse.Namespace()) == errors.EXIT_REFUSED
    assert capsys.readouterr().err.splitlines() == ["error: c1: not applied", "refused: needs an approval"]


async def test_invoke_keeps_the_traceback_of_a_bug() -> None:
    async def buggy(args: argparse.Namespace) -> int:
        raise KeyError("not the user's fault")

    with pytest.raises(KeyError):
        await cli.invoke(buggy, argparse.Namespace())


@pytest.mark.parametrize("missing", ["uvicorn", "starlette", "plotly"])
def test_the_dashboard_without_its_extra_names_the_extra(
    missing: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import sys

    for name in [m for m in sys.modules if m == missing or m.startswith(f"{missing}.") or m.startswith("infrarsi.dashboard")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, missing, None)  # what an install without the extra gives: ImportError
    code = cli.main(["--data-dir", str(tmp_path), "dashboard", "--port", "0"])
    err = capsys.readouterr().err
    assert code == errors.EXIT_USAGE
    assert err.strip() == (f"error: infrarsi dashboard needs the dashboard extra ({missing} is missing): "
                           "pip install 'infrarsi[dashboard]'")
