"""Files and values the CLI reads from the user (issue 16, item 5): limits and one-line errors, no tracebacks.

Covers: a 50 MB contract refused before it is parsed (``init`` does not hang, starts nothing, tags nothing);
random bytes, a NUL byte, unsafe YAML tags and unclosed brackets named as such; ``--set`` values that are not
YAML scalars; a bank import over its limit.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from infrarsi.bank.store import parse_import_file
from infrarsi.cli import main
from infrarsi.commands.trial import parse_knobs
from infrarsi.study import userfiles
from infrarsi.study.contract import ContractError, load_contract


def _big_contract(path: Path, size: int) -> Path:
    line = "  knob_{:09d}: {{type: int, low: 1, high: 8}}\n"
    per = len(line.format(0))
    path.write_text("name: big\nsearch_space:\n knobs:\n" + "".join(line.format(i) for i in range(size // per)))
    return path


def test_a_50mb_contract_is_refused_before_parsing(tmp_path) -> None:
    path = _big_contract(tmp_path / "big.yaml", 50 << 20)
    started = time.monotonic()
    with pytest.raises(ContractError) as info:
        load_contract(path)
    assert time.monotonic() - started < 5.0
    assert "over the 1.0 MiB limit" in str(info.value) and str(path) in str(info.value)


def test_init_of_a_huge_contract_fails_fast_and_leaves_nothing(tmp_path, capsys) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    contract = _big_contract(repo / "contract.yaml", 50 << 20)
    data_dir = tmp_path / "data"
    started = time.monotonic()
    code = main(["--data-dir", str(data_dir), "--nats-url", "nats://127.0.0.1:1", "init", str(contract)])
    assert code == 2 and time.monotonic() - started < 10.0
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "limit" in err and "Traceback" not in err
    assert not data_dir.exists(), "nothing started, nothing written"
    tags = subprocess.run(["git", "-C", str(repo), "tag"], capture_output=True, text=True, check=True).stdout
    assert tags == ""


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (os.urandom(1 << 16).replace(b"\n", b"") + b"\xff", "not UTF-8 text"),
        (b"name: x\x00\n", "binary"),
        (b"name: !!python/object/apply:os.system ['touch x']\n", "could not determine a constructor"),
        (b"name: [unclosed\n", "invalid YAML in the contract"),
        (b"name: " + b"[" * 5000 + b"]" * 5000 + b"\n", "invalid YAML in the contract"),
    ],
    ids=["random-bytes", "nul", "python-tag", "unclosed", "deep"],
)
def test_unusable_contract_files_are_named(tmp_path, content, fragment) -> None:
    path = tmp_path / "c.yaml"
    path.write_bytes(content)
    with pytest.raises(ContractError) as info:
        load_contract(path)
    assert fragment in str(info.value) and str(info.value).startswith(str(path))
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    ("item", "fragment"),
    [
        ("tp=!!python/object/apply:os.system ['touch x']", "could not determine a constructor"),
        ("tp=[unclosed", "expected ',' or ']'"),
        ("tp=[1, 2]", "must be a scalar"),
    ],
)
def test_set_values_that_are_not_scalars_are_clear_errors(item, fragment) -> None:
    with pytest.raises(ValueError) as info:
        parse_knobs([item])
    assert fragment in str(info.value) and str(info.value).startswith("--set")


def test_set_scalars_still_parse() -> None:
    assert parse_knobs(["a=4", "b=0.5", "c=true", "d=fused"]) == {"a": 4, "b": 0.5, "c": True, "d": "fused"}


def test_a_bank_import_over_its_limit_is_refused(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(userfiles, "MAX_IMPORT_BYTES", 1024)
    path = tmp_path / "bank.jsonl"
    path.write_text("{}\n" * 1000)
    with pytest.raises(ValueError, match="over the"):
        parse_import_file(path, cluster_id="c")
