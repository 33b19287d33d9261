"""``infrarsi init CONTRACT.yaml``: lock a contract and open a study.

Validates the contract (nothing else happens if it is wrong), fixes the golden baseline in the workload's
git repo (``infrarsi.workspace``), hashes every locked file, and publishes ``StudyCreated``. The pure part,
``prepare_study``, is separate from publishing so it can be used and tested without NATS.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import NamedTuple

from infrarsi import events as ev
from infrarsi.contract import Contract, ContractError, load_contract
from infrarsi.workspace import Workspace, WorkspaceError, prepare_workspace

SOURCE = "cli.init"


class PreparedStudy(NamedTuple):
    study_id: str
    created: ev.StudyCreated
    workspace: Workspace
    contract: Contract


def prepare_study(
    contract_path: Path | str, data_dir: Path | str, *, study_id: str | None = None
) -> PreparedStudy:
    """Validate the contract, prepare the workspace and build ``StudyCreated`` (nothing is published).

    Raises ``ContractError`` for an invalid contract (before touching any repo) and ``WorkspaceError``
    when the workload repo cannot hold a baseline (uncommitted changes, no commits).
    """
    contract = load_contract(contract_path)
    study_id = study_id or ev.new_id()
    workspace = prepare_workspace(contract, study_id, data_dir)
    created = ev.StudyCreated(
        name=contract.name,
        goal=contract.goal,
        contract=contract.to_dict(),
        contract_sha256=contract.sha256(),
        workload_dir=str(workspace.repo),
        baseline_ref=workspace.baseline_ref,
        locked_files=contract.locked_files(workspace.repo),
        cluster=contract.cluster.info(),
    )
    return PreparedStudy(study_id, created, workspace, contract)


def study_created_event(prepared: PreparedStudy) -> ev.Event:
    """The envelope; its id is derived from the study id, so a retried publish is deduplicated."""
    return ev.make_event(
        prepared.created,
        study_id=prepared.study_id,
        source=SOURCE,
        cluster_id=prepared.contract.cluster.id,
        event_id=ev.derived_id(prepared.study_id, "StudyCreated"),
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("contract", type=Path, help="the contract YAML")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    # SUPPRESS: a global --data-dir/--nats-url on the main parser is not overwritten by these defaults.
    parser.add_argument(
        "--data-dir", type=Path, default=argparse.SUPPRESS, help="state directory (default .infrarsi)"
    )
    parser.add_argument(
        "--nats-url", default=argparse.SUPPRESS, help="NATS server (default: $INFRARSI_NATS_URL or embedded)"
    )


def data_dir_of(args: argparse.Namespace) -> Path:
    return Path(getattr(args, "data_dir", None) or os.environ.get("INFRARSI_DATA_DIR", ".infrarsi"))


async def run(args: argparse.Namespace) -> int:
    data_dir = data_dir_of(args)
    try:
        load_contract(args.contract)  # validate before starting or reaching any server
    except ContractError as exc:
        for line in exc.lines():
            print(f"error: {line}", file=sys.stderr)
        return 2

    # Imported late: validating a contract must work where NATS is not installed or reachable.
    from infrarsi.bus import BusError
    from infrarsi.embedded import EmbeddedServerError

    try:
        async with connected_bus(getattr(args, "nats_url", None), data_dir) as bus:
            try:
                prepared = prepare_study(args.contract, data_dir)
            except ContractError as exc:  # the workload changed between the two loads
                for line in exc.lines():
                    print(f"error: {line}", file=sys.stderr)
                return 2
            except WorkspaceError as exc:
                print(f"error: {args.contract}: workload.repo: {exc}", file=sys.stderr)
                return 2
            event = study_created_event(prepared)
            await bus.publish(event)
    except (BusError, EmbeddedServerError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1

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
                }
            )
        )
    else:
        print(prepared.study_id)
    return 0


@contextlib.asynccontextmanager
async def connected_bus(nats_url: str | None, data_dir: Path):
    """A bus connection: to ``--nats-url``/``$INFRARSI_NATS_URL``/a running ``infrarsi up``, else to a
    temporary embedded server over the same data directory (the event lands in the store ``up`` uses)."""
    from infrarsi.bus import Bus
    from infrarsi.embedded import EmbeddedServer, resolve_nats_url

    url = resolve_nats_url(nats_url, data_dir)
    server = None
    if url is None:
        print(f"note: no NATS server running; starting a temporary one over {data_dir}", file=sys.stderr)
        server = EmbeddedServer.start(data_dir)
        url = server.url
    try:
        bus = await Bus.connect(url, service=SOURCE)
        try:
            yield bus
        finally:
            await bus.close()
    finally:
        if server is not None:
            server.stop()
