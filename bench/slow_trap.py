"""A knob value 10× slower than its prior says, on a REAL job: the study's accelerator-seconds with the trap
and without it, side by side in one run (issue 13).

The job (``tests/support/slowed_workload.py``) is a tiny real PyTorch training loop with the real probe; its
``knobs.autocast_dtype: bfloat16`` sleeps ``bf16_factor`` × longer per step than ``float32`` (the math is the
same). The built-in CPU prior says bf16 is faster. Two studies on one embedded stack (nats-server and the six
services, local backend), each ``init`` → ``doctor`` → ``run --until searched`` exactly as a user types them:

- trap: ``bf16_factor`` 10 — the prior is 10× wrong;
- no trap: ``bf16_factor`` 0.8 — the prior is right.

Printed per study: every trial in order (kind, candidate, status, accelerator-seconds), the study's total
accelerator-seconds (doctor and search trials, stopped and failed ones included; the verify runs the
proposer asks for afterwards are not part of the search and are not counted), and the ratio trap / no trap
(issue 13's bar: ≤ 1.5). Checked on the trap study: after its first ``stopped_slow`` or ``timeout`` bf16 trial,
no bf16 candidate is proposed while a float32 one is untried.

    nice -n 10 python bench/slow_trap.py [--trials 6] [--steps 12] [--step-s 0.3] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _common import write_json  # noqa: E402
from infrarsi import events as ev  # noqa: E402
from support.slowed_workload import make_slowed_workload  # noqa: E402

PLAIN, SLOW = "float32", "bfloat16"
KNOB = "knobs.autocast_dtype"
PLAIN_CANDIDATES = 4
"""float32 × the four ``dataloader_workers`` values."""


@dataclass(frozen=True)
class TrialRow:
    """One trial of a study as the log tells it (``TrialProposed`` + ``TrialFinished`` + ``TrialMeasured``)."""

    trial_id: str
    kind: str = "search"
    knobs: dict[str, object] = field(default_factory=dict)
    """The candidate's launch keys (empty: the golden baseline)."""
    status: str = "ok"
    accelerator_s: float = 0.0
    step_time_s: float | None = None
    """Telemetry's steady step time (``None``: nothing measured)."""


@dataclass(frozen=True)
class StudyResult:
    study_id: str
    bf16_factor: float
    trials: list[TrialRow]
    accelerator_s: float
    """Doctor and search trials (every status); verify runs excluded."""
    wall_s: float

    def search(self) -> list[TrialRow]:
        return [t for t in self.trials if t.kind == "search"]

    def bf16_after_ruled_out(self) -> list[str]:
        """bf16 search trials proposed after the first stopped or timed-out bf16 one while a float32 candidate
        was still untried (issue 13: there must be none)."""
        rows, bad = self.search(), []
        first = next((i for i, t in enumerate(rows) if t.knobs.get(KNOB) == SLOW
                      and t.status in ("stopped_slow", "timeout")), None)
        if first is None:
            return []
        for i in range(first + 1, len(rows)):
            plain_tried = {str(sorted(t.knobs.items())) for t in rows[:i] if t.knobs.get(KNOB, PLAIN) == PLAIN}
            if rows[i].knobs.get(KNOB) == SLOW and len(plain_tried) < PLAIN_CANDIDATES:
                bad.append(rows[i].trial_id)
        return bad


def _rows(events: list[ev.Event]) -> list[TrialRow]:
    proposed: dict[str, ev.TrialProposed] = {}
    finished: dict[str, ev.TrialFinished] = {}
    measured: dict[str, ev.TrialMeasured] = {}
    order: list[str] = []
    for e in events:
        tid = e.trial_id or ""
        match e.payload:
            case ev.TrialProposed() as p:
                proposed[tid] = p
            case ev.TrialFinished() as f:
                finished[tid] = f
                order.append(tid)
            case ev.TrialMeasured() as m:
                measured[tid] = m
            case _:
                pass
    rows = []
    for tid in order:
        p, f, m = proposed.get(tid), finished[tid], measured.get(tid)
        rows.append(TrialRow(tid, p.kind if p else "?", dict(p.candidate.knobs) if p else {}, f.status,
                             f.accelerator_s, m.step_time_s if m is not None and m.step_time_s > 0 else None))
    return rows


async def run_study(root: Path, url: str, data_dir: Path, *, bf16_factor: float, trials: int, steps: int,
                    step_s: float) -> StudyResult:
    """One study on the running stack: init → doctor → run --until searched, then its trials from the log."""
    from infrarsi.bus.client import Bus
    from infrarsi.commands import doctor as doctor_cmd
    from infrarsi.commands import run as run_cmd
    from infrarsi.commands.demo import _stage_args
    from infrarsi.commands.init import prepare_study, publish_study
    from infrarsi.commands.study_log import read_study

    started = time.monotonic()
    contract = make_slowed_workload(root, bf16_factor=bf16_factor, steps=steps, step_s=step_s, trials=trials)
    prepared = prepare_study(contract, data_dir)
    bus = await Bus.connect(url, service="cli.init", data_dir=data_dir)
    try:
        await publish_study(bus, prepared)
    finally:
        await bus.close()
    study = prepared.study_id
    if rc := await doctor_cmd.run(_stage_args(doctor_cmd, [study], url, data_dir)):
        raise RuntimeError(f"doctor failed with exit code {rc}")
    if rc := await run_cmd.run(_stage_args(run_cmd, [study, "--trials", str(trials), "--until", "searched"], url,
                                          data_dir)):
        raise RuntimeError(f"run failed with exit code {rc}")
    bus = await Bus.connect(url, service="cli.report", ensure=False, data_dir=data_dir)
    try:
        events, _ = await read_study(bus, study)
    finally:
        await bus.close()
    rows = _rows(events)
    spent = sum(t.accelerator_s for t in rows if t.kind in ("doctor", "baseline", "search"))
    return StudyResult(study, bf16_factor, rows, spent, time.monotonic() - started)


async def trap_vs_no_trap(work: Path, *, trials: int = 6, steps: int = 12, step_s: float = 0.3,
                          trap_factor: float = 10.0, fair_factor: float = 0.8) -> tuple[StudyResult, StudyResult]:
    """Both studies on one embedded stack under ``work`` (stopped on every path)."""
    from infrarsi.runtime.stack import ensure_stack_for_verb

    data_dir = work / "data"
    url, stack = await ensure_stack_for_verb(None, data_dir)
    try:
        trap = await run_study(work / "trap", url, data_dir, bf16_factor=trap_factor, trials=trials, steps=steps,
                               step_s=step_s)
        fair = await run_study(work / "no-trap", url, data_dir, bf16_factor=fair_factor, trials=trials,
                               steps=steps, step_s=step_s)
    finally:
        if stack is not None:
            await asyncio.to_thread(stack.stop)
    return trap, fair


def _print(result: StudyResult, label: str) -> None:
    print(f"\n{label}: bf16 {result.bf16_factor:g}x the float32 step (study {result.study_id}, {result.wall_s:.0f} s)")
    for t in result.trials:
        knobs = ", ".join(f"{k.removeprefix('knobs.')}={v}" for k, v in sorted(t.knobs.items())) or "(baseline)"
        step = f"{t.step_time_s:.3f} s/step" if t.step_time_s else "-"
        print(f"  {t.kind:8s} {knobs:45s} {t.status:14s} {t.accelerator_s:7.1f} acc-s  {step}")
    print(f"  accelerator-seconds (doctor + search): {result.accelerator_s:.1f}")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=6, help="search trials per study")
    ap.add_argument("--steps", type=int, default=12, help="steps per trial")
    ap.add_argument("--step-s", type=float, default=0.3,
                    help="the float32 step's sleep (s): large enough that steps, not process start, dominate a trial")
    ap.add_argument("--json", dest="json_out", default=None)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="slow-trap-") as tmp:
        trap, fair = asyncio.run(trap_vs_no_trap(Path(tmp), trials=args.trials, steps=args.steps,
                                                 step_s=args.step_s))
    _print(trap, "trap")
    _print(fair, "no trap")
    ratio = trap.accelerator_s / fair.accelerator_s
    late = trap.bf16_after_ruled_out()
    print(f"\naccelerator-seconds trap / no trap: {trap.accelerator_s:.1f} / {fair.accelerator_s:.1f} = {ratio:.2f}x "
          f"(issue 13: <= 1.5x); bf16 proposed after it was ruled out while float32 remained: {len(late)}")
    write_json(args.json_out, {"real_job": True, "trap": asdict(trap), "no_trap": asdict(fair), "ratio": ratio,
                               "bf16_after_ruled_out": late})
    return 0


if __name__ == "__main__":
    sys.exit(main())
