"""``infrarsi run STUDY [--trials N] [--parallel K]``: start (or extend) a study's search and follow it.

Publishes one ``RunRequested`` (the proposer starts searching on it; ``trials`` is the study's total of search
trials, capped by the contract's locked budget) and follows the study's events with a progress bar on
stderr: search trials done / N, the best speed-up so far over the baseline (verified once a
``VerifyCompleted`` says so, else measured: doctor's baseline step time over the best measured search
step), OOMs, and accelerator-seconds spent (every trial of the study, failed ones included). It ends when the
proposer's ``VerifyRequested`` arrives (the search is over; ``--until finished`` waits for ``StudyFinished``,
i.e. for the verifications too). ``--json`` prints a summary instead of the last line.

The proposer does the work; this command only asks and watches, so ``--no-wait`` publishes and returns.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from infrarsi import events as ev
from infrarsi.commands.study_log import OpenStudy, add_follow_arguments, follow_study, study_verb
from infrarsi.errors import UserError
from infrarsi.study.ledger import TrialLedger, TrialOutcome
from infrarsi.study.lifecycle import summary_of
from infrarsi.verdicts import verification as vf

if TYPE_CHECKING:
    from infrarsi.bus.client import Bus


SOURCE = "cli.run"
BAR_WIDTH = 24


@dataclass
class RunProgress:
    """What the progress bar shows, folded from the study's events (pure)."""

    target: int
    ledger: TrialLedger = field(default_factory=TrialLedger)
    search_trials: set[str] = field(default_factory=set)
    done: int = 0
    ooms: int = 0
    baseline_s: float | None = None
    best_measured_s: float | None = None
    best_measured_key: str | None = None
    best_verified: float | None = None
    best_verified_key: str | None = None
    verify_requested: ev.VerifyRequested | None = None
    finished: ev.StudyFinished | None = None

    def apply(self, event: ev.Event) -> None:
        tid = event.trial_id
        match event.payload:
            case ev.DoctorCompleted(step_time_s=step):
                self.baseline_s = step
            case ev.TrialProposed(kind="search") as p if tid:
                self.search_trials.add(tid)
                self.ledger.proposed(tid, p)
            case ev.TrialFinished() as f if tid:
                self._count(self.ledger.finished(tid, f))
            case ev.TrialMeasured() as m if tid:
                self._count(self.ledger.measured(tid, m))
            case ev.VerifyRequested() as request:
                self.verify_requested = request
            case ev.VerifyCompleted() as done if done.promotable:
                if self.best_verified is None or done.speedup > self.best_verified:
                    self.best_verified, self.best_verified_key = done.speedup, done.candidate_key
            case ev.StudyFinished() as finished:
                self.finished = finished
            case _:
                pass

    def _count(self, outcome: TrialOutcome | None) -> None:
        if outcome is None or outcome.trial_id not in self.search_trials:
            return
        self.done += 1
        self.ooms += outcome.status == "oom"
        if outcome.status == "ok" and outcome.step_time_s and (
            self.best_measured_s is None or outcome.step_time_s < self.best_measured_s
        ):
            self.best_measured_s = outcome.step_time_s
            self.best_measured_key = outcome.candidate.key() if outcome.candidate is not None else None

    @property
    def accelerator_s(self) -> float:
        return self.ledger.accelerator_s

    def best(self) -> tuple[float | None, str]:
        """(best speed-up, ``verified`` | ``measured``)."""
        if self.best_verified is not None:
            return self.best_verified, "verified"
        if self.baseline_s and self.best_measured_s:
            return self.baseline_s / self.best_measured_s, "measured"
        return None, "measured"

    def line(self) -> str:
        filled = min(BAR_WIDTH, round(BAR_WIDTH * self.done / self.target)) if self.target else BAR_WIDTH
        speedup, how = self.best()
        best = f"best ×{speedup:.3f} ({how})" if speedup is not None else "best —"
        return (f"run [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {self.done}/{self.target} trials  {best}  "
                f"OOM {self.ooms}  {self.accelerator_s:,.0f} accelerator-s")

    def summary(self) -> dict[str, object]:
        speedup, how = self.best()
        return {
            "trials_done": self.done,
            "trials_target": self.target,
            "ooms": self.ooms,
            "accelerator_s": self.accelerator_s,
            "best_speedup": speedup,
            "best_speedup_kind": how,
            "best_measured_key": self.best_measured_key,
            "best_verified_key": self.best_verified_key,
            "verify_candidates": [c.key() for c in self.verify_requested.candidates] if self.verify_requested else [],
            "finished_reason": self.finished.reason if self.finished else None,
        }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("study", help="study id")
    parser.add_argument("--trials", type=int, default=None, help="search trials in total (default: the contract's budget)")
    parser.add_argument("--parallel", type=int, default=None, help="trials in flight (default: contract backend.parallel)")
    parser.add_argument("--until", choices=["searched", "finished"], default="searched",
                        help="return when the search ends (VerifyRequested) or when the study finishes (StudyFinished)")
    add_follow_arguments(parser, timeout_s=24 * 3600.0, follows="the search", request="RunRequested",
                         json_help="print a JSON summary at the end")


async def _run(bus: Bus, args: argparse.Namespace, study: OpenStudy) -> int:
    events, next_seq, created = study.events, study.next_seq, study.created
    summary = summary_of(events, args.study)
    if summary is not None and summary.stage == "cancelled":  # the proposer would wait for a resume
        raise UserError(f"study {args.study} is cancelled ({summary.cancelled_reason}): `infrarsi resume "
                        f"{args.study}` first")
    budget = study.contract.budget.trials
    if args.trials is not None and not 1 <= args.trials <= budget:
        raise UserError(f"--trials must be in 1..{budget} (the contract's locked budget.trials)")
    if args.parallel is not None and args.parallel < 1:
        raise UserError("--parallel must be at least 1")
    doctor = [e.payload for e in events if isinstance(e.payload, ev.DoctorCompleted)]
    if not doctor:
        print("note: no DoctorCompleted for this study yet: speed-ups show once a baseline is known "
              "(run `infrarsi doctor` first)", file=sys.stderr)
    else:  # what the verify stage after this search will spend, before any of it is spent
        print(vf.predicted_verify_cost(study.contract, doctor[-1].step_time_s).line(), file=sys.stderr)
    request = ev.make_event(ev.RunRequested(trials=args.trials, parallel=args.parallel), study_id=args.study,
                            source=SOURCE, cluster_id=created.cluster.cluster_id)
    await bus.publish(request)
    if args.no_wait:
        print(f"requested: {request.event_id}")
        return 0

    progress = RunProgress(target=args.trials or budget)
    for event in events:
        progress.apply(event)
    # only what the proposer says after this request ends the wait
    progress.verify_requested = progress.finished = None
    seen_request = False
    tty = sys.stderr.isatty()
    last = ""
    async for new in follow_study(bus, args.study, next_seq, timeout_s=args.timeout,
                                  unfinished=lambda: "the search did not end"):
        for event in new:
            if event.event_id == request.event_id:
                seen_request = True
                continue
            if seen_request or not isinstance(event.payload, ev.VerifyRequested | ev.StudyFinished):
                progress.apply(event)
        line = progress.line()
        if line != last:
            print(("\r" + line) if tty else line, end="" if tty else "\n", file=sys.stderr, flush=True)
            last = line
        done = progress.finished is not None or (args.until == "searched" and progress.verify_requested is not None)
        if done:
            break
    if tty:
        print(file=sys.stderr)
    if args.json:
        print(json.dumps(progress.summary(), indent=2))
    else:
        if progress.verify_requested is not None:
            print(f"search ended: {progress.verify_requested.reason}")
        if progress.finished is not None:
            print(f"study finished: {progress.finished.reason}")
    return 0


run = study_verb(SOURCE, _run)
"""``infrarsi run STUDY``."""
