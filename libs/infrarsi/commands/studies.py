"""``infrarsi studies``, ``infrarsi cancel STUDY`` and ``infrarsi resume STUDY``: studies as things you manage.

``studies`` lists every study on the bus (``infrarsi.study.lifecycle.summarize``: stage, trials, in flight, best verified
speed-up, accelerator cost; ``--json`` one object per line). ``cancel`` records ``StudyCancelled`` with the reason
and who asked; the launcher stops the study's running trials (each ends ``cancelled`` with its cost kept), the
proposer and the verifier start nothing new; it waits until no trial of the study is in flight. ``resume``
records ``StudyResumed`` for a cancelled study, or for one whose search or verification has nothing in flight
any more (a stack that crashed under it): the proposer re-runs what the cancel cut short and goes on.
"""

from __future__ import annotations

import argparse
import getpass
import json
import socket
import sys

from infrarsi import events as ev
from infrarsi.bus.client import Bus
from infrarsi.bus.subjects import LIFECYCLE_STREAM, STREAM_SUBJECTS
from infrarsi.commands.study_log import OpenStudy, cli_bus, follow_study, study_verb
from infrarsi.errors import EXIT_USAGE, UserError
from infrarsi.study.lifecycle import StudySummary, summarize, summary_of

CANCEL_WAIT_S = 120.0
"""How long ``cancel`` waits for the launcher to stop the study's trials (``--timeout``)."""


def who() -> str:
    """``user@host`` of the person at the CLI, for the audit trail."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


# ---------------------------------------------------------------------------------------------------- studies


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="one JSON object per study, newest first")
    parser.add_argument("--stage", choices=("created", "doctor", "searching", "verifying", "finished", "cancelled"),
                        help="only studies at this stage")


async def run(args: argparse.Namespace) -> int:
    async with cli_bus(args, "cli.studies", ensure=False) as bus:
        summaries = summarize([e async for e in bus.events(LIFECYCLE_STREAM, STREAM_SUBJECTS[LIFECYCLE_STREAM][0])])
    if args.stage:
        summaries = [s for s in summaries if s.stage == args.stage]
    if args.json:
        for summary in summaries:
            print(json.dumps(summary.as_json()))
        return 0
    print("\n".join(table(summaries)))
    return 0


def table(summaries: list[StudySummary]) -> list[str]:
    """The human listing: one line per study."""
    if not summaries:
        return ["no studies on the bus"]
    header = (f"{'study':26s}  {'name':18s} {'stage':10s} {'trials':>6s} {'running':>7s} {'failed':>6s}"
              f"  {'best verified':22s} {'accel-h':>8s}  note")
    lines = [header, "-" * len(header)]
    for s in summaries:
        failed = sum(n for status, n in s.outcomes.items() if status != "ok")
        best = "—"
        if s.best_speedup is not None and s.best_ci is not None:
            best = f"×{s.best_speedup:.3f} [{s.best_ci[0]:.2f}, {s.best_ci[1]:.2f}]"
        note = ""
        if s.cancelled_reason is not None:
            note = f"cancelled by {s.cancelled_by}: {s.cancelled_reason}"
        elif s.verification is not None:
            note = f"verifying {len(s.verification.pending)} of {s.verification.candidates} candidate(s)"
        elif s.promoted:
            states = [f"{b} ({s.promotion_states.get(b, 'not followed')})" for b in s.promoted]
            note = "promoted " + ", ".join(states)
        lines.append(f"{s.study_id:26s}  {s.name[:18]:18s} {s.stage:10s} {s.trials:6d} {s.in_flight:7d} {failed:6d}"
                     f"  {best:22s} {s.accelerator_s / 3600:8.3f}  {note}")
    return lines


# ---------------------------------------------------------------------------------------------------- cancel


def add_cancel_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("study", help="study id")
    parser.add_argument("--reason", default="cancelled by hand", help="why (recorded in StudyCancelled)")
    parser.add_argument("--timeout", type=float, default=CANCEL_WAIT_S,
                        help="seconds to wait for the study's running trials to stop")
    parser.add_argument("--no-wait", action="store_true", help="record StudyCancelled and return")


async def _cancel(bus: Bus, args: argparse.Namespace, study: OpenStudy) -> int:
    summary = summary_of(study.events, args.study)
    assert summary is not None  # open_study found its StudyCreated
    if summary.stage == "finished":
        raise UserError(f"study {args.study} is finished ({summary.finish_reason}): nothing to cancel", EXIT_USAGE)
    if summary.stage == "cancelled":
        raise UserError(f"study {args.study} is cancelled already (by {summary.cancelled_by}: "
                        f"{summary.cancelled_reason})", EXIT_USAGE)
    reason = args.reason.strip()
    if not reason:
        raise UserError("--reason is empty: say why the study is cancelled", EXIT_USAGE)
    cancelled = ev.make_event(ev.StudyCancelled(reason=reason, by=who()), study_id=args.study, source="cli.cancel",
                              cluster_id=study.created.cluster.cluster_id)
    await bus.publish(cancelled)
    print(f"cancelled {args.study} at stage {summary.stage}: {summary.in_flight} trial(s) in flight", file=sys.stderr)
    if args.no_wait or summary.in_flight == 0:
        print(cancelled.event_id)
        return 0
    events = list(study.events)
    async for new in follow_study(bus, args.study, study.next_seq, timeout_s=args.timeout,
                                  unfinished=lambda: "the study's trials did not all stop"):
        events += new
        now = summary_of(events, args.study)
        if now is not None and now.in_flight == 0:
            stopped = now.outcomes.get("cancelled", 0) - summary.outcomes.get("cancelled", 0)
            print(f"{stopped} trial(s) ended cancelled; the study has cost {now.accelerator_s:.1f} accelerator-s "
                  f"({now.failed_accelerator_s:.1f} of them in trials that did not end ok)", file=sys.stderr)
            break
    print(cancelled.event_id)
    return 0


run_cancel = study_verb("cli.cancel", _cancel)
"""``infrarsi cancel STUDY``."""


# ---------------------------------------------------------------------------------------------------- resume


def add_resume_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("study", help="study id")
    parser.add_argument("--reason", default="", help="why (recorded in StudyResumed)")


async def _resume(bus: Bus, args: argparse.Namespace, study: OpenStudy) -> int:
    summary = summary_of(study.events, args.study)
    assert summary is not None
    problem = resume_problem(summary)
    if problem is not None:
        raise UserError(f"cannot resume study {args.study}: {problem}", EXIT_USAGE)
    resumed = ev.make_event(ev.StudyResumed(reason=args.reason, by=who()), study_id=args.study, source="cli.resume",
                            cluster_id=study.created.cluster.cluster_id)
    await bus.publish(resumed)
    was = "cancelled" if summary.stage == "cancelled" else f"stalled while {summary.stage}"
    print(f"resumed {args.study} ({was}); follow it with `infrarsi studies` or `infrarsi run {args.study}`",
          file=sys.stderr)
    print(resumed.event_id)
    return 0


def resume_problem(summary: StudySummary) -> str | None:
    """Why a study cannot be resumed now; ``None`` when it can (cancelled, or a search or verification with
    nothing in flight: what a stack that crashed under it leaves)."""
    if summary.stage == "cancelled":
        return None
    if summary.stage == "finished":
        return (f"it is finished ({summary.finish_reason}); `infrarsi run {summary.study_id} --trials N` "
                "extends its search")
    if summary.stage in ("created", "doctor"):
        return f"its search has not started (stage {summary.stage}); `infrarsi run {summary.study_id}` starts it"
    if summary.in_flight:
        return f"it is {summary.stage} with {summary.in_flight} trial(s) in flight: nothing to resume"
    return None


run_resume = study_verb("cli.resume", _resume)
"""``infrarsi resume STUDY``."""
