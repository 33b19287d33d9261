"""``infrarsi init CONTRACT.yaml``: lock a contract and open a study (``--ask``: a language model drafts it first,
``commands/init_ask.py``).

Validates the contract (nothing else happens if it is wrong), fixes the golden baseline in the workload's
git repo (``infrarsi.trial.workspace``), hashes every locked file, resolves the experience bank for the study (the
similar entries, the priors they give and the winners to start from: ``StudyCreated.bank``, see
``infrarsi.bank.resolve``), and publishes ``StudyCreated``. The pure part, ``prepare_study``, is separate from
publishing so it can be used and tested without NATS; ``run`` reads the bank (local ∪ shared) and passes it in.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec

from infrarsi import events as ev
from infrarsi.agent.draft_log import exchange_events, load_exchange
from infrarsi.commands import UserError, data_dir_of
from infrarsi.commands.init_ask import add_ask_arguments, draft_contract, split_command
from infrarsi.study.contract import Contract, load_contract
from infrarsi.trial.workspace import Workspace, WorkspaceError, discard_workspace, prepare_workspace

if TYPE_CHECKING:
    from infrarsi.bus.client import Bus


SOURCE = "cli.init"


class PreparedStudy(NamedTuple):
    study_id: str
    created: ev.StudyCreated
    workspace: Workspace
    contract: Contract
    notes: tuple[str, ...] = ()
    """What could not be done and was skipped (e.g. the bank, when the study's space cannot be built)."""


def prepare_study(
    contract_path: Path | str,
    data_dir: Path | str,
    *,
    study_id: str | None = None,
    bank_entries: Sequence[ev.BankEntry] = (),
) -> PreparedStudy:
    """Validate the contract, prepare the workspace and build ``StudyCreated`` (nothing is published).

    ``bank_entries`` is the bank as this cluster sees it; what the study takes from it is resolved here and
    recorded in ``StudyCreated.bank`` (with no entries: only the study's own bank metadata) and the matching
    entry ids in ``StudyCreated.bank_seeds``.

    Raises ``ContractError`` for an invalid contract (before touching any repo) and ``WorkspaceError``
    when the workload repo cannot hold a baseline (uncommitted changes, no commits).
    """
    contract = load_contract(contract_path)
    study_id = study_id or ev.new_id()
    workspace = prepare_workspace(contract, study_id, data_dir)
    try:
        created = ev.StudyCreated(
            name=contract.name,
            goal=contract.goal,
            contract=contract.to_dict(),
            contract_sha256=contract.sha256(),
            workload_dir=str(workspace.repo),
            baseline_ref=workspace.baseline_ref,
            locked_files=contract.locked_files(workspace.repo),
            locked_inputs=contract.locked_inputs(),
            cluster=contract.cluster.info(),
        )
        created, notes = with_bank(created, bank_entries)
    except BaseException:
        discard_workspace(workspace)  # no study, so no golden tag left in the user's repo
        raise
    return PreparedStudy(study_id, created, workspace, contract, notes)


async def publish_study(bus: Bus, prepared: PreparedStudy, created: ev.StudyCreated | None = None) -> ev.Event:
    """Publish the study's ``StudyCreated`` (``created`` replacing the prepared one); if the publish fails, the
    study does not exist, and its golden tag or snapshot is removed again."""
    event = study_created_event(prepared._replace(created=created) if created is not None else prepared)
    try:
        await bus.publish(event)
    except BaseException:
        discard_workspace(prepared.workspace)
        raise
    return event


def with_bank(created: ev.StudyCreated, bank_entries: Sequence[ev.BankEntry]) -> tuple[ev.StudyCreated, tuple[str, ...]]:
    """``created`` with the bank resolved for it; unchanged (and a note) when its search space cannot be built
    here — the services would report the same problem when the study starts."""
    from infrarsi.bank.resolve import resolve_bank, study_meta
    from infrarsi.study.space import load_study_space

    try:
        study = load_study_space(created)
    except Exception as exc:  # noqa: BLE001 — the bank is an optimisation: a study opens without it
        return created, (f"experience bank not consulted: cannot build the search space: {type(exc).__name__}: {exc}",)
    resolution = resolve_bank(bank_entries, study, study_meta(study, created.cluster))
    return msgspec.structs.replace(created, bank=resolution, bank_seeds=[m.entry_id for m in resolution.matches]), ()


def bank_summary(created: ev.StudyCreated, entries_seen: int) -> dict[str, Any]:
    """What ``init`` says about the bank (``--json``): the entries that inform the study and why, how many
    feature priors they give, and the seeds."""
    bank = created.bank
    if bank is None:
        return {"consulted": False, "entries_seen": entries_seen}
    return {
        "consulted": True,
        "entries_seen": entries_seen,
        "matches": [{"entry_id": m.entry_id, "similarity": round(m.similarity, 4), "why": m.why} for m in bank.matches],
        "priors": {"time": len(bank.time_priors), "memory": len(bank.memory_priors)},
        "seeds": [{"candidate_key": s.candidate.key(), "candidate": msgspec.to_builtins(s.candidate),
                   "entry_id": s.entry_id, "similarity": round(s.similarity, 4), "reason": s.reason}
                  for s in bank.seeds],
    }


def bank_lines(created: ev.StudyCreated, entries_seen: int) -> list[str]:
    """The same, for people: one line per informing entry and per seed."""
    bank = created.bank
    if bank is None:
        return []
    if not bank.matches:
        return [f"bank: none of {entries_seen} entries is similar enough to seed this study"]
    lines = [f"bank: {len(bank.matches)} of {entries_seen} entries seed this study "
             f"({len(bank.time_priors)} time and {len(bank.memory_priors)} memory priors):"]
    lines += [f"bank:   {m.entry_id}  similarity {m.similarity:.2f}  {m.why}" for m in bank.matches]
    lines += [f"bank:   seed {s.candidate.key()[:8]} from {s.entry_id}: {s.reason}" for s in bank.seeds]
    return lines


def study_created_event(prepared: PreparedStudy) -> ev.Event:
    """The envelope; its id is derived from the study id, so a retried publish is deduplicated."""
    return ev.make_event(
        prepared.created,
        study_id=prepared.study_id,
        source=SOURCE,
        cluster_id=prepared.contract.cluster.id,
        event_id=ev.derived_id(prepared.study_id, "StudyCreated"),
    )


def _add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    add_ask_arguments(parser)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("contract", type=Path, help="the contract YAML (with --ask: where the draft is written)")
    _add_options(parser)
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="with --ask: -- then the job's launch command, to scaffold the draft from")


async def run(args: argparse.Namespace) -> int:
    # callers in-process (tests, other verbs) may build the namespace with the contract and --json alone
    args = argparse.Namespace(**{"command": [], "ask": None, "repo": None, "yes": False, **vars(args)})
    data_dir = data_dir_of(args)
    options = argparse.ArgumentParser(prog="infrarsi init", add_help=False, exit_on_error=False)
    _add_options(options)
    try:
        command = split_command(args, options)
    except argparse.ArgumentError as exc:
        raise UserError(str(exc)) from None
    if args.ask is not None:
        draft_contract(args, command)  # writes the contract only once the user accepts the model's draft
    elif command or args.yes or args.repo is not None:
        raise UserError("a launch command, --repo and --yes go with --ask")
    load_contract(args.contract)  # validate before starting or reaching any server (ContractError: EXIT_USAGE)
    try:
        drafted = load_exchange(args.contract)  # init --ask's exchange, for the study's log
    except ValueError as exc:
        raise UserError(str(exc)) from None

    # Imported late: validating a contract must work where NATS is not installed or reachable.
    from infrarsi.bank.federation import read_bank_entries
    from infrarsi.commands.study_log import recording_bus

    async with recording_bus(args, SOURCE) as bus:
        bank_entries = await read_bank_entries(bus)
        try:  # a ContractError here: the workload changed between the two loads
            prepared = prepare_study(args.contract, data_dir, bank_entries=bank_entries)
        except WorkspaceError as exc:
            raise UserError(f"{args.contract}: workload.repo: {exc}") from None
        event = await publish_study(bus, prepared)
        if drafted is not None:
            for exchanged in exchange_events(prepared.study_id, prepared.contract.cluster.id, drafted,
                                             Path(args.contract).read_text()):
                await bus.publish(exchanged)

    if args.json:
        print(
            json.dumps(
                {
                    "study_id": prepared.study_id,
                    "name": prepared.created.name,
                    "event_id": event.event_id,
                    "workload_dir": prepared.created.workload_dir,
                    "baseline_ref": prepared.created.baseline_ref,
                    "golden_tag": prepared.workspace.tag,
                    "snapshot": prepared.workspace.snapshot,
                    "contract_sha256": prepared.created.contract_sha256,
                    "locked_files": len(prepared.created.locked_files),
                    "bank": bank_summary(prepared.created, len(bank_entries)),
                    "notes": list(prepared.notes),
                }
            )
        )
    else:
        print(prepared.study_id)  # stdout is the study id alone (scripts capture it); the rest goes to stderr
        for line in [*bank_lines(prepared.created, len(bank_entries)), *(f"note: {n}" for n in prepared.notes)]:
            print(line, file=sys.stderr)
    return 0
