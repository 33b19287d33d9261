"""``infrarsi init CONTRACT --ask "…" --repo DIR -- CMD``: a scripted model behind a real chat-completions server
drafts the contract from the scaffold of examples/lightning; the draft is shown, written only when accepted,
and then locked by ``init`` against a real nats-server. A draft that reaches beyond the scaffold and the
request, or that is malformed, is refused by name and nothing is written or opened."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import duckdb
import pytest
from infrarsi import events as ev
from infrarsi.agent.draft_log import exchange_path
from infrarsi.bus.client import Bus
from infrarsi.bus.subjects import LIFECYCLE_STREAM
from infrarsi.cli import main
from infrarsi.report import build_report, render_markdown
from infrarsi.report.source import load_events
from infrarsi.study.contract import load_contract
from support.agent_repo import commit, proposals
from support.chat_server import ChatScript, Turn, chat_server

pytestmark = pytest.mark.integration

LIGHTNING = Path(__file__).resolve().parents[2] / "examples" / "lightning"
COMMAND = ["python", "train.py", "--max-steps", "20", "--batch-size", "2", "--accumulate-grad-batches", "8",
           "--precision", "32-true", "--val-check-interval", "10", "--num-workers", "0"]
REQUEST = "Make this job faster. You may edit train.py; keep the micro-batch at 4 or less."
NARROWED = {"goal": "Train the Lightning example faster with the same loss curve.",
            "scope": {"files": ["train.py"]},
            "search_space": {"knobs": {"batch-size": {"type": "int", "choices": [1, 2, 4]}}},
            "budget": {"trials": 8}}


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """examples/lightning as a user has it: its own git repository, no contract yet."""
    repo = tmp_path / "lightning"
    shutil.copytree(LIGHTNING, repo, ignore=shutil.ignore_patterns("contract.yaml", "__pycache__", "lightning_logs"))
    commit(repo)
    return repo


def init_ask(monkeypatch, tmp_path: Path, repo: Path, base_url: str, *extra: str,
             nats_url: str | None = None, request: str = REQUEST) -> tuple[int, Path]:
    monkeypatch.setenv("INFRARSI_LLM_BASE_URL", base_url)
    monkeypatch.setenv("INFRARSI_LLM_MODEL", "scripted")
    target = tmp_path / "contract.yaml"
    head = ["--nats-url", nats_url] if nats_url else []
    rc = main([*head, "--data-dir", str(tmp_path / "data"), "init", str(target), "--ask", request, "--repo", str(repo),
               *extra, "--", *COMMAND])
    return rc, target


def golden_tags(repo: Path) -> list[str]:
    return subprocess.run(["git", "-C", str(repo), "tag"], capture_output=True, text=True, check=True).stdout.split()


def test_the_models_draft_is_shown_written_on_yes_and_locked(nats_server, monkeypatch, tmp_path, repo, capsys) -> None:
    script = ChatScript([Turn(proposals(contract=NARROWED, reason="the user allows train.py; batch-size ≤ 4"))])
    with chat_server(script) as url:
        rc, target = init_ask(monkeypatch, tmp_path, repo, url, "--yes", nats_url=nats_server)
    out, err = capsys.readouterr()
    assert rc == 0, err
    contract = load_contract(target)
    assert contract.scope.files == ["train.py"]
    assert contract.search_space.knobs["batch-size"].choices == [1, 2, 4]
    assert contract.budget.trials == 8 and contract.goal == NARROWED["goal"]
    assert "+  - train.py" in err and "the model's reason: the user allows train.py" in err  # the diff, the words
    assert "# request: Make this job faster." in target.read_text()
    study_id = out.strip()
    assert f"infrarsi/{study_id}/golden" in golden_tags(repo)  # init locked the accepted draft
    # the model saw the request, the scaffold's draft and the repository's files — as data
    prompt = script.requests[0]["body"]["messages"][1]["content"]
    assert REQUEST in prompt and "launch_keys" in prompt and '"train.py"' in prompt
    # the exchange reached the study's log after StudyCreated (kept beside the contract until then), and the
    # report shows it
    log = asyncio.run(study_log(nats_server, study_id))
    assert [e.type for e in log] == ["StudyCreated", "AgentAsked", "AgentAnswered"]
    asked, answered = log[1].payload, log[2].payload
    assert asked.purpose == "contract" and asked.messages[1].content == prompt and answered.ask_id == asked.ask_id
    assert answered.ok and answered.contract is not None and answered.contract["scope"]["files"] == ["train.py"]
    assert answered.tokens == 150 and answered.detail == ""  # the contract as the draft wrote it
    assert exchange_path(target).is_file()
    con = duckdb.connect()
    load_events(con, list(enumerate(log, start=1)))
    draft = build_report(con, study_id).contract_draft
    assert draft is not None and draft.request == REQUEST and draft.reason == "the user allows train.py; batch-size ≤ 4"
    md = render_markdown(build_report(con, study_id), tmp_path / "report.md")[0].read_text()
    assert "Drafted by a language model (init --ask, model scripted, 150 tokens" in md and REQUEST in md


def test_a_hand_edited_drafted_contract_still_carries_its_exchange(nats_server, monkeypatch, tmp_path, repo,
                                                                    capsys) -> None:
    """The draft accepted but the study opened later with plain ``init``, after an edit: the exchange is still
    published, and its answer says the contract was edited since; a sidecar that does not decode is an error."""
    with chat_server(ChatScript([Turn(proposals(contract=NARROWED, reason="narrower"))])) as url:
        rc, target = init_ask(monkeypatch, tmp_path, repo, url, "--yes", nats_url=nats_server)
    assert rc == 0
    capsys.readouterr()
    target.write_text(target.read_text().replace("trials: 8", "trials: 6"))
    assert main(["--nats-url", nats_server, "--data-dir", str(tmp_path / "data"), "init", str(target)]) == 0
    study_id = capsys.readouterr().out.strip()
    log = asyncio.run(study_log(nats_server, study_id))
    assert [e.type for e in log] == ["StudyCreated", "AgentAsked", "AgentAnswered"]
    assert log[2].payload.detail == "the contract was edited after the user accepted this draft"

    exchange_path(target).write_text("{not json")
    assert main(["--nats-url", nats_server, "--data-dir", str(tmp_path / "data"), "init", str(target)]) == 2
    assert "not an init --ask exchange" in capsys.readouterr().err


async def study_log(nats_url: str, study_id: str) -> list[ev.Event]:
    bus = await Bus.connect(nats_url, service="test")
    try:
        return [e async for e in bus.events(LIFECYCLE_STREAM) if e.study_id == study_id]
    finally:
        await bus.close()


def test_nothing_is_written_without_acceptance(monkeypatch, tmp_path, repo, capsys) -> None:
    with chat_server(ChatScript([Turn(proposals(contract=NARROWED, reason="narrower"))])) as url:
        rc, target = init_ask(monkeypatch, tmp_path, repo, url)  # stdin is not a terminal, no --yes
    assert rc == 3 and not target.exists()
    assert "draft not accepted" in capsys.readouterr().err and not golden_tags(repo)


@pytest.mark.parametrize(("answer", "named"), [
    (proposals(contract={"scope": {"files": ["train.py"]}}, reason="edit the script"),
     "'train.py' is neither editable in the draft nor named in the request"),
    (proposals(contract={"scope": {"files": ["../outside.py"]}}, reason="x"), "'../outside.py' is not a file"),
    (proposals(contract={"workload": {"command": ["rm", "-rf", "/"]}}, reason="x"),
     "the draft may not set workload"),
    (proposals(contract={"search_space": {"knobs": {"batch-size": {"type": "int", "choices": [2, 64]}}}}, reason="x"),
     "values [64] beyond the draft's choices"),
    (proposals(contract={"invariants": {"steps": False}}, reason="x"), "invariants.steps"),
    (proposals(contract={"invariants": {"loss": {"tolerance": 0.5}}}, reason="x"), "invariants.loss"),
    (proposals(contract={"budget": {"trials": 500}}, reason="x"), "budget.trials: 500 is above"),
    (proposals(contract={"budget": {"trials": -1}}, reason="x"), "malformed: budget.trials"),
    ("Sure! Here is your contract: name: x", "not_json"),
    (proposals(contract=["not", "a", "mapping"], reason="x"), "malformed: the answer needs an object"),
])
def test_a_draft_beyond_the_scope_or_malformed_is_refused_and_nothing_written(
        monkeypatch, tmp_path, repo, capsys, answer: str, named: str) -> None:
    with chat_server(ChatScript([Turn(answer)])) as url:
        rc, target = init_ask(monkeypatch, tmp_path, repo, url, "--yes", request="Make this job faster.")
    err = capsys.readouterr().err
    assert rc == 3, err
    assert "the model's draft was refused" in err and named in err, err
    assert not target.exists() and not golden_tags(repo)


def test_a_model_that_fails_is_a_clear_error(monkeypatch, tmp_path, repo, capsys) -> None:
    with chat_server(ChatScript([Turn(status=503)])) as url:
        monkeypatch.setenv("INFRARSI_LLM_API_KEY", "sk-test-0123456789abcdefghijklmnop")
        rc, target = init_ask(monkeypatch, tmp_path, repo, url, "--yes")
    err = capsys.readouterr().err
    assert rc == 1 and "the model gave no draft (http_error" in err and not target.exists()
    assert "sk-test-0123456789" not in err


def test_no_model_configured_is_a_usage_error(monkeypatch, tmp_path, repo, capsys) -> None:
    for name in ("INFRARSI_LLM_BASE_URL", "INFRARSI_LLM_MODEL"):
        monkeypatch.delenv(name, raising=False)
    target = tmp_path / "contract.yaml"
    rc = main(["--data-dir", str(tmp_path / "data"), "init", str(target), "--ask", REQUEST, "--repo", str(repo),
               "--", *COMMAND])
    assert rc == 2 and "no language model configured" in capsys.readouterr().err and not target.exists()


def test_without_a_command_the_model_narrows_an_existing_contract(monkeypatch, tmp_path, repo, capsys) -> None:
    target = tmp_path / "contract.yaml"
    assert main(["scaffold", "--repo", str(repo), "--out", str(target), "--", *COMMAND]) == 0
    before = target.read_text()
    with chat_server(ChatScript([Turn(proposals(contract={"budget": {"trials": 6}}, reason="a smaller budget"))])) as url:
        monkeypatch.setenv("INFRARSI_LLM_BASE_URL", url)
        monkeypatch.setenv("INFRARSI_LLM_MODEL", "scripted")
        rc = main(["--data-dir", str(tmp_path / "data"), "init", str(target), "--ask", "a smaller budget"])
    assert rc == 3 and target.read_text() == before  # shown, not accepted: unchanged
    err = capsys.readouterr().err
    assert "-  trials: 12" in err and "+  trials: 6" in err, err
