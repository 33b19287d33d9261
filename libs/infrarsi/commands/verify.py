"""``infrarsi verify STUDY [--top K]``: re-run the best candidates against the untouched baseline.

Picks the top-K search candidates from the study's log (``verification.select_candidates``: median step
time over ok, invariant-passing search runs, faster than the baseline), publishes one ``VerifyRequested``,
and follows the verifier service's ``VerifyCompleted`` events (one per round; a verification ends when the
candidate is promotable or a round fails), printing speed-up with its CI, MFU before/after and the verdicts.
The verifier service does the work (plans, TrialProposed kind=verify, decisions); this command only asks
and watches, so ``--no-wait`` publishes and returns.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

import msgspec

from infrarsi import events as ev
from infrarsi.bus.client import PublishRaced
from infrarsi.bus.subjects import LIFECYCLE_STREAM, lifecycle_subject
from infrarsi.commands.study_log import OpenStudy, add_follow_arguments, follow_study, study_verb
from infrarsi.errors import EXIT_FAILED, EXIT_USAGE, UserError
from infrarsi.study.lifecycle import summary_of
from infrarsi.verdicts import verification as vf

if TYPE_CHECKING:
    from infrarsi.bus.client import Bus


SOURCE = "cli.verify"


def candidates_from_log(events: list[ev.Event], k: int) -> list[vf.RankedCandidate]:
    proposed: dict[str, ev.TrialProposed] = {}
    measured: list[tuple[str, ev.TrialMeasured]] = []
    baseline_s = None
    for event in events:
        match event.payload:
            case ev.TrialProposed() as p if event.trial_id:
                proposed[event.trial_id] = p
            case ev.TrialMeasured() as m if event.trial_id:
                measured.append((event.trial_id, m))
            case ev.DoctorCompleted(step_time_s=t):
                baseline_s = t
    runs = [(t, proposed[t], m) for t, m in measured if t in proposed]
    return vf.select_candidates(runs, k, baseline_step_s=baseline_s)


def refuse_while_busy(study_id: str, events: list[ev.Event], *, fresh_request: bool) -> None:
    """A ``UserError`` when the study is cancelled or a verification of it is still running (``fresh_request``:
    a ``VerifyRequested`` landed after ``events`` were read)."""
    summary = summary_of(events, study_id)
    if summary is None:
        return
    if summary.stage == "cancelled":
        raise UserError(f"study {study_id} is cancelled ({summary.cancelled_reason}): `infrarsi resume {study_id}` "
                        "first", EXIT_USAGE)
    running = summary.verification
    if running is not None:
        raise UserError(
            f"a verification of study {study_id} is running: requested by {running.requested_by} at "
            f"{running.requested_at:%Y-%m-%d %H:%M:%S} UTC, {len(running.pending)} of {running.candidates} "
            f"candidate(s) without a final verdict; wait for it, or `infrarsi cancel {study_id}`", EXIT_USAGE)
    if fresh_request:
        raise UserError(f"a verification of study {study_id} was requested just now: refused; see `infrarsi studies`",
                        EXIT_USAGE)


def verdict_line(done: ev.VerifyCompleted) -> str:
    round_no = done.passes if vf.round_passed(done) else done.passes + 1
    mfu = ""
    if done.mfu_before is not None and done.mfu_after is not None:
        mfu = f"  MFU {done.mfu_before:.1%} → {done.mfu_after:.1%}"
    verdict = "PROMOTABLE" if done.promotable else ("pass" if vf.round_passed(done) else "FAIL")
    why = ""
    if done.failed_invariants:
        why = "  failed: " + ", ".join(done.failed_invariants)
    elif not vf.round_passed(done):
        why = "  CI includes ×1.0 (no speed-up shown)"
    return (
        f"{done.candidate_key}  round {round_no}: ×{done.speedup:.3f} [{done.ci_low:.3f}, {done.ci_high:.3f}]"
        f"  {done.baseline_step_s * 1e3:.2f} → {done.candidate_step_s * 1e3:.2f} ms{mfu}  {verdict}"
        f" ({done.passes} passed){why}"
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("study", help="study id")
    parser.add_argument("--top", type=int, default=None, help="candidates to verify (default: contract verify.top_k)")
    parser.add_argument("--repeats", type=int, default=None, help="interleaved pairs per round (default: contract)")
    add_follow_arguments(parser, timeout_s=6 * 3600.0, follows="the verdicts", request="VerifyRequested",
                         json_help="print the final VerifyCompleted events as JSON lines")


async def _verify(bus: Bus, args: argparse.Namespace, study: OpenStudy) -> int:
    study_id, events, created, contract = args.study, study.events, study.created, study.contract
    request_subject = lifecycle_subject(study_id, "VerifyRequested")
    last_request_seq = await bus.last_seq_on(LIFECYCLE_STREAM, request_subject)
    refuse_while_busy(study_id, events, fresh_request=last_request_seq >= study.next_seq)
    top = args.top or contract.verify.top_k
    ranked = candidates_from_log(events, top)
    if not ranked:
        raise UserError("no candidate to verify (no ok, invariant-passing search trial faster than the baseline)",
                        EXIT_FAILED)
    doctor = [e.payload for e in events if isinstance(e.payload, ev.DoctorCompleted)]
    if doctor:
        cost = vf.predicted_verify_cost(contract, doctor[-1].step_time_s, candidates=len(ranked),
                                        repeats=args.repeats or contract.verify.repeats)
        print(cost.line(), file=sys.stderr)
    for r in ranked:
        print(f"verifying {r.candidate_key}: {r.step_time_s * 1e3:.2f} ms over {r.runs} search runs  {r.candidate.knobs} {r.candidate.patches}", file=sys.stderr)
    request = ev.make_event(
        ev.VerifyRequested(
            candidates=[r.candidate for r in ranked],
            repeats=args.repeats or contract.verify.repeats,
            steps=contract.workload.verify_steps,
            reason=f"infrarsi verify --top {top}",
        ),
        study_id=study_id, source=SOURCE, cluster_id=created.cluster.cluster_id,
    )
    try:  # stored only if no other VerifyRequested landed since the check: two `verify`s cannot both start
        await bus.publish(request, expected_last_subject_seq=last_request_seq)
    except PublishRaced:
        raise UserError(f"a verification of study {study_id} was requested while this one was being prepared: "
                        "refused; see `infrarsi studies`", EXIT_USAGE) from None
    if args.no_wait:
        print(request.event_id)
        return 0

    waiting = {vf.verify_id_for(request.event_id, r.candidate_key): r for r in ranked}
    final: dict[str, ev.VerifyCompleted] = {}
    async for new in follow_study(bus, study_id, study.next_seq, timeout_s=args.timeout,
                                  unfinished=lambda: f"{len(waiting) - len(final)} verifications unfinished"):
        for event in new:
            match event.payload:
                case ev.VerifyCompleted(verify_id=vid) as done if vid in waiting and vid not in final:
                    print(verdict_line(done), file=sys.stderr if args.json else sys.stdout)
                    if vf.is_final(done):
                        final[vid] = done
        if len(final) == len(waiting):
            break
    if args.json:
        for done in final.values():
            print(msgspec.json.encode(done).decode())
    promotable = [d for d in final.values() if d.promotable]
    print(f"{len(promotable)} of {len(final)} candidates promotable", file=sys.stderr)
    return 0


run = study_verb(SOURCE, _verify)
"""``infrarsi verify STUDY``."""
