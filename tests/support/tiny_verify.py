"""One verification through all six services on the reference dense-1node job, shrunk to seconds a run.

``verify_candidates`` writes the shrunk workload and its contract (patches the library ships outside any
contract's search space added to it, the invariants updated as a test asks), starts the stack, publishes
``StudyCreated`` and one ``VerifyRequested``, and returns the final ``VerifyCompleted`` of each candidate by its
first patch id. The shrink is ``test_verify_hacks``'s: 2 layers of width 96, 64-token sequences, 16 a step,
20 steps, one intra-op thread, eval every 5 steps (~12 s a run on a shared 2-core host).

``example_contract`` is the same for the own-job examples (``examples/hf-trainer``, ``examples/lightning``): a copy
of the example with its contract's verify section replaced and planted patches of its library added.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import Any

import yaml
from infrarsi import events as ev
from infrarsi.bus.client import Bus
from infrarsi.commands.init import prepare_study, study_created_event
from infrarsi.commands.study_log import read_study
from infrarsi.runtime.stack import Stack

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
EXAMPLE_OUTPUTS = {"hf-trainer": ("out",), "lightning": ("lightning_logs",)}
"""What a run by hand leaves in an example's folder, not copied."""
EXAMPLE_DOWNSTREAM = {"command": ["{python}", "evaluate.py", "--weights", "{weights}"], "metric": "perplexity",
                      "tolerance": 0.01}  # fmt: skip
"""The examples' downstream evaluation: held-out perplexity of the final weights, 1 % worse at most."""
WORKLOAD = ROOT / "workloads" / "gpt"
DENSE = WORKLOAD / "contracts" / "dense-1node.yaml"
TINY = {
    "model": {"vocab_size": 256, "seq_len": 64, "n_layer": 2, "n_head": 4, "d_model": 96, "mlp_hidden": 384},
    "run": {"steps": 20, "global_batch_size": 16, "lr": 0.01, "warmup_steps": 3, "eval_every": 5, "eval_batch_size": 8},
    "knobs": {"intra_op_threads": 1},
}


def tiny_contract(
    tmp_path: Path, *, add_patches: list[str], invariants: dict[str, Any] | None = None,
    verify: dict[str, Any] | None = None,
) -> Path:  # fmt: skip
    repo = tmp_path / "workload"
    shutil.copytree(WORKLOAD, repo, ignore=shutil.ignore_patterns("__pycache__", ".infrarsi"))
    launch = repo / "launch" / "dense-1node.yaml"
    golden = yaml.safe_load(launch.read_text())
    for section, values in TINY.items():
        golden[section].update(values)
    launch.write_text(yaml.safe_dump(golden, sort_keys=False))
    contract = yaml.safe_load(DENSE.read_text())
    contract["workload"]["repo"] = str(repo)
    contract["workload"]["steps"] = contract["workload"]["verify_steps"] = TINY["run"]["steps"]
    contract["workload"]["env"]["OMP_NUM_THREADS"] = "1"
    contract["search_space"]["constraints"]["global_batch"]["size"] = TINY["run"]["global_batch_size"]
    micro = contract["search_space"]["knobs"]["knobs.micro_batch_size"]
    micro["choices"] = [m for m in micro["choices"] if TINY["run"]["global_batch_size"] % m == 0]
    contract["search_space"]["patches"] += [p for p in add_patches if p not in contract["search_space"]["patches"]]
    contract["invariants"].update(invariants or {})
    contract["verify"] = {"top_k": 1, "repeats": 1, "passes_required": 1, **(verify or {})}
    path = tmp_path / "dense-verify.yaml"
    path.write_text(yaml.safe_dump(contract, sort_keys=False))
    return path


def example_contract(
    tmp_path: Path, example: str, *, add_patches: list[str], verify: dict[str, Any],
    invariants: dict[str, Any] | None = None, steps: int | None = None,
) -> Path:  # fmt: skip
    """A copy of ``examples/<example>`` and its contract: verify ``{top_k, repeats, passes_required}`` of 1 and
    ``verify``, ``add_patches`` in the search space, ``invariants`` updated, and both horizons ``steps`` when
    given (else the contract's own)."""
    repo = tmp_path / example
    shutil.copytree(EXAMPLES / example, repo,
                    ignore=shutil.ignore_patterns("__pycache__", ".infrarsi", *EXAMPLE_OUTPUTS[example]))  # fmt: skip
    contract = yaml.safe_load((EXAMPLES / example / "contract.yaml").read_text())
    contract["workload"]["repo"] = str(repo)
    if steps is not None:
        contract["workload"]["steps"] = contract["workload"]["verify_steps"] = steps
    contract["search_space"]["patches"] += [p for p in add_patches if p not in contract["search_space"]["patches"]]
    contract["invariants"].update(invariants or {})
    contract["verify"] = {"top_k": 1, "repeats": 1, "passes_required": 1, **verify}
    path = tmp_path / f"{example}-verify.yaml"
    path.write_text(yaml.safe_dump(contract, sort_keys=False))
    return path


async def verify_candidates(
    tmp_path: Path, patches: list[str], *, invariants: dict[str, Any] | None = None, timeout_s: float = 800.0,
    verify: dict[str, Any] | None = None,
) -> dict[str, ev.VerifyCompleted]:
    candidates = [ev.Candidate(patches=[p]) for p in patches]
    contract = tiny_contract(tmp_path, add_patches=patches, invariants=invariants, verify=verify)
    verdicts = await run_verification(tmp_path, contract, candidates, timeout_s=timeout_s)
    return {v.candidate.patches[0]: v for v in verdicts}


async def run_verification(
    tmp_path: Path, contract: Path, candidates: list[ev.Candidate], *, timeout_s: float = 800.0,
    reason: str = "planted candidates",
) -> list[ev.VerifyCompleted]:  # fmt: skip
    """Start the stack, create the study of ``contract``, request one verification of ``candidates`` (``reason``:
    the request's) and return each candidate's final ``VerifyCompleted`` (in the order of ``candidates``; fewer on
    a timeout)."""
    data_dir = tmp_path / "data"
    stack = await asyncio.to_thread(Stack.start, data_dir)
    verdicts: dict[str, ev.VerifyCompleted] = {}
    try:
        prepared = prepare_study(contract, data_dir)
        bus = await Bus.connect(stack.url, service="admin", data_dir=data_dir)  # the stack turned auth on
        try:
            await bus.publish(study_created_event(prepared))
            await bus.publish(ev.make_event(
                ev.VerifyRequested(candidates=candidates, repeats=1, reason=reason),
                study_id=prepared.study_id, source="cli.verify",
            ))
            for _ in range(int(timeout_s)):
                events, _ = await read_study(bus, prepared.study_id)
                verdicts = {e.payload.candidate_key: e.payload for e in events
                            if isinstance(e.payload, ev.VerifyCompleted)}
                if len(verdicts) == len(candidates):
                    break
                await asyncio.sleep(1.0)
        finally:
            await bus.close()
    finally:
        await asyncio.to_thread(stack.stop)
    ordered = [verdicts[c.key()] for c in candidates if c.key() in verdicts]
    for verdict in ordered:  # for the log of a -s run
        print(f"verdict {verdict.candidate_key}: promotable={verdict.promotable} failed={verdict.failed_invariants}")
        for inv in verdict.invariants:
            print(f"  {inv.name}: ok={inv.ok} {inv.detail}")
    return ordered
