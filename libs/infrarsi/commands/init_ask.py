"""``infrarsi init CONTRACT --ask "REQUEST" [--repo DIR] [--yes] [-- launch command]``: the model drafts the contract.

The base draft is the scaffold's for the launch command (``infrarsi.study.scaffold``), or the contract already at
CONTRACT when no command is given. The model is asked once (``infrarsi.agent.client``, configured by the
environment or the base's ``agent:`` section), its answer checked by ``infrarsi.agent.drafts.check_draft``
(only the draftable sections, never wider than the base and the request allow, a valid contract), and the
change from the base shown as a diff with the model's words. Nothing is written until the user accepts —
at the prompt, or with ``--yes`` for scripts; then CONTRACT is written whole (the request and the model's
reason in its header), the exchange beside it (``CONTRACT.ask.json``, ``agent.draft_log``: published into the
study's log after ``StudyCreated``), and ``init`` goes on to lock it as usual. Every refusal names its reason
and leaves CONTRACT as it was.
"""

from __future__ import annotations

import argparse
import difflib
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from infrarsi import events as ev
from infrarsi.agent.client import AgentError, AgentUnconfigured, ChatClient, ChatReply
from infrarsi.agent.draft_log import DraftExchange, exchange_path, save_exchange, text_sha256
from infrarsi.agent.drafts import Draft, DraftRefused, check_draft, draft_messages
from infrarsi.errors import EXIT_FAILED, EXIT_REFUSED, UserError
from infrarsi.study import userfiles
from infrarsi.study.contract import AgentSpec

MAX_REPO_FILES = 2000


def add_ask_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--ask", default=None, metavar="REQUEST",
                        help="have the language model draft CONTRACT from this request (see docs/agent.md)")
    parser.add_argument("--repo", type=Path, default=None,
                        help="with --ask: the directory the launch command runs in (default: CONTRACT's directory)")
    parser.add_argument("--yes", action="store_true", help="with --ask: accept the model's draft without asking")


def split_command(args: argparse.Namespace, options: argparse.ArgumentParser) -> list[str]:
    """The launch command after ``--``; options written after CONTRACT are parsed into ``args`` first (argparse
    hands everything after the first positional to the command's REMAINDER)."""
    rest = list(args.command or [])
    cut = rest.index("--") if "--" in rest else len(rest)
    if cut:
        options.parse_args(rest[:cut], namespace=args)
    return rest[cut + 1:]


def draft_contract(args: argparse.Namespace, command: list[str]) -> None:
    """Ask, check, show, and write CONTRACT once the user accepts (see the module docstring)."""
    target: Path = args.contract
    repo = (args.repo or target.resolve().parent).resolve()
    if not repo.is_dir():
        raise UserError(f"--repo {repo} is not a directory")
    base = _base_draft(target, repo, command)
    files = repo_files(repo)
    client = _client(base)
    messages = draft_messages(args.ask, base, files)
    max_tokens = AgentSpec().max_tokens
    reply = _ask(client, messages, max_tokens=max_tokens)
    try:
        draft = check_draft(reply.text, base, request=args.ask, repo_files=files, base_dir=target.resolve().parent)
    except DraftRefused as exc:
        raise UserError(f"the model's draft was refused; {target} was not written", EXIT_REFUSED,
                        details=exc.reasons) from None
    print(review(base, draft, reply.prompt_tokens + reply.completion_tokens), file=sys.stderr)
    if not _accepted(args, target):
        raise UserError(f"draft not accepted; {target} was not written (pass --yes to accept it)", EXIT_REFUSED)
    text = _write(target, draft, args.ask)
    save_exchange(target, _exchange(client, messages, max_tokens, reply, draft, text, base))
    print(f"wrote {target} (the model's exchange beside it: {exchange_path(target).name})", file=sys.stderr)


def _exchange(client: ChatClient, messages: list[ev.AgentMessage], max_tokens: int, reply: ChatReply, draft: Draft,
              text: str, base: dict[str, Any]) -> DraftExchange:
    """The accepted exchange as the study's log will hold it (``agent.draft_log``): prompt and answer redacted."""
    ask_id = ev.new_id()
    asked = ev.AgentAsked(ask_id=ask_id, purpose="contract", model=client.endpoint.model,
                          endpoint=client.endpoint.base_url, max_tokens=max_tokens,
                          messages=[ev.AgentMessage(role=m.role, content=client.redact(m.content)) for m in messages])
    usd_per_1k = AgentSpec.model_validate(base.get("agent") or {}).usd_per_1k_tokens
    tokens = reply.prompt_tokens + reply.completion_tokens
    answered = ev.AgentAnswered(ask_id=ask_id, ok=True, text=reply.text, prompt_tokens=reply.prompt_tokens,
                                completion_tokens=reply.completion_tokens, cost_usd=tokens / 1000.0 * usd_per_1k,
                                attempts=reply.attempts, latency_s=round(reply.latency_s, 3), contract=draft.data)
    return DraftExchange(asked=asked, answered=answered, contract_sha256=text_sha256(text))


def repo_files(repo: Path) -> list[str]:
    """The repository's files (git's list where it is a git repo; a walk otherwise), relative, at most
    ``MAX_REPO_FILES``."""
    listed = subprocess.run(["git", "-C", str(repo), "ls-files", "-z"], capture_output=True, text=True)
    if listed.returncode == 0:
        return [f for f in listed.stdout.split("\0") if f][:MAX_REPO_FILES]
    files = [p.relative_to(repo).as_posix() for p in sorted(repo.rglob("*"))
             if p.is_file() and ".git" not in p.relative_to(repo).parts]
    return files[:MAX_REPO_FILES]


def review(base: dict[str, Any], draft: Draft, tokens: int) -> str:
    """What the user decides on: the change from the base draft, and the model's reason."""
    before = yaml.safe_dump(base, sort_keys=False).splitlines(keepends=True)
    after = yaml.safe_dump(draft.data, sort_keys=False).splitlines(keepends=True)
    diff = "".join(difflib.unified_diff(before, after, "draft (scaffold)", "draft (the model's)")) or "(no change)\n"
    return f"{diff}\nthe model's reason: {draft.reason or '(none given)'}\n({tokens} tokens)"


def _base_draft(target: Path, repo: Path, command: list[str]) -> dict[str, Any]:
    if command:
        from infrarsi.study.scaffold import ScaffoldError, scaffold

        if target.exists():
            raise UserError(f"{target} exists; give no launch command to have the model narrow it, or another path")
        try:
            text, _report = scaffold(command, repo, contract_dir=target.resolve().parent)
        except ScaffoldError as exc:
            raise UserError(str(exc)) from None
        drafted = yaml.safe_load(text)
        assert isinstance(drafted, dict), "the scaffold renders a mapping"
        return drafted
    if not target.exists():
        raise UserError(f"--ask needs a launch command after '--' (to scaffold) or an existing {target} to narrow")
    try:
        data = userfiles.load_yaml(target, what="the contract")
    except userfiles.UserFileError as exc:
        raise UserError(f"{target}: {exc.problem}") from None
    if not isinstance(data, dict):
        raise UserError(f"{target}: a contract must be a YAML mapping")
    return data


def _client(base: dict[str, Any]) -> ChatClient:
    try:
        return ChatClient.for_spec(AgentSpec.model_validate(base.get("agent") or {}))
    except AgentUnconfigured as exc:
        raise UserError(f"--ask: {exc}") from None
    except AgentError as exc:
        raise UserError(f"--ask: {exc.kind}: {exc.detail}") from None
    except ValueError as exc:
        raise UserError(f"--ask: the draft's agent section: {exc}") from None


def _ask(client: ChatClient, messages: list[ev.AgentMessage], *, max_tokens: int) -> ChatReply:
    try:
        return client.chat(messages, max_tokens=max_tokens)
    except AgentError as exc:
        raise UserError(f"the model gave no draft ({exc.kind} after {exc.attempts} attempt(s)): {exc.detail}",
                        EXIT_FAILED) from None


def _accepted(args: argparse.Namespace, target: Path) -> bool:
    if args.yes:
        return True
    if not sys.stdin.isatty():
        return False
    return input(f"write {target} and open the study? [y/N] ").strip().lower() in ("y", "yes")


def _write(target: Path, draft: Draft, request: str) -> str:
    """CONTRACT, whole or not at all (its text returned); its header keeps the request and the model's words."""
    header = ["# Drafted by a language model (infrarsi init --ask) and accepted by the user.",
              *(f"# request: {line}" for line in request.splitlines()),
              *(f"# the model's reason: {line}" for line in (draft.reason or "(none given)").splitlines())]
    text = "\n".join(header) + "\n" + yaml.safe_dump(draft.data, sort_keys=False)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, target)
    return text
