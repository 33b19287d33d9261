"""distil(): a study's facts -> one transferable, deterministic, data-free BankEntry."""

from __future__ import annotations

import msgspec
from infrarsi import events as ev
from infrarsi.bank.distil import MAX_DETAIL_CHARS, StudyFacts, TrialFact, bank_event, distil, entry_id_for
from infrarsi.bus import subjects

META = ev.BankMeta(accelerator="H100-80G", generation="hopper", device_memory_bytes=80 * 2**30, interconnect="ib",
                   nodes=8, devices_per_node=8, parallelism={"dp": 64}, model_family="dense", model_params=7e9,
                   seq_len=4096, global_batch=512, micro_batch=1, precision="bf16")


def cand(mb: int, *patches: str) -> ev.Candidate:
    return ev.Candidate(knobs={"micro_batch": mb}, patches=list(patches))


def verify(c: ev.Candidate, speedup: float, promotable: bool = True, failed: tuple[str, ...] = ()) -> ev.VerifyCompleted:
    return ev.VerifyCompleted(verify_id="v", candidate=c, candidate_key=c.key(), passes=2, promotable=promotable,
                              speedup=speedup, ci_low=speedup - 0.02, ci_high=speedup + 0.02, baseline_step_s=2.0,
                              candidate_step_s=2.0 / speedup, mfu_before=None, mfu_after=None, invariants=[],
                              failed_invariants=list(failed), trial_ids=[])


def facts() -> StudyFacts:
    eff = [ev.Effect(feature="intercept", prior_mean=0, prior_std=3, post_mean=0.7, post_std=0.01),
           ev.Effect(feature="micro_batch:log2", prior_mean=-0.04, prior_std=0.06, post_mean=-0.1, post_std=0.02),
           ev.Effect(feature="bad", prior_mean=0, prior_std=1, post_mean=float("nan"), post_std=0.1)]
    trials = [
        TrialFact(candidate=cand(1), status="ok", step_time_s=2.0, kind="baseline"),
        TrialFact(candidate=cand(2), status="ok", step_time_s=1.7),
        TrialFact(candidate=cand(4), status="ok", step_time_s=1.5),
        TrialFact(candidate=cand(8), status="oom", censored_peak_bytes=79e9, memory_capacity_bytes=80e9,
                  reason="CUDA out of memory " + "x" * 1000),
        TrialFact(candidate=cand(2, "fp8_linear"), status="invariant_violation", step_time_s=1.2, reason="loss"),
        TrialFact(candidate=cand(1, "slow"), status="ok", step_time_s=2.5),
    ]
    return StudyFacts(study_id="study-1", meta=META, time_effects=eff, memory_effects=eff[1:2], trials=trials,
                      verifications=[verify(cand(2), 1.18), verify(cand(4), 1.05, promotable=False, failed=("loss",))],
                      baseline_step_s=2.0)


def test_distil_keeps_the_lesson_and_drops_the_workload() -> None:
    entry = distil(facts())
    assert entry.entry_id == entry_id_for("study-1") and entry.origin_study == "study-1" and entry.meta == META
    assert [e.feature for e in entry.time_effects] == ["micro_batch:log2"]  # no intercept, no NaN
    # verified first; the candidate whose verification failed an invariant is never a winner; slower than the
    # baseline neither; the invariant violation is not a winner either
    assert entry.winners == [cand(2)]
    kinds = [(f.kind, f.candidate.knobs["micro_batch"]) for f in entry.failures]
    assert kinds == [("oom", 8), ("invariant_violation", 2), ("invariant_violation", 4)]
    oom = entry.failures[0]
    assert oom.censored_peak_bytes == 79e9 and oom.capacity_bytes == 80e9
    assert len(oom.detail) == MAX_DETAIL_CHARS


def test_a_trial_stopped_as_slow_is_kept_as_a_timeout_is() -> None:
    """A search trial stopped early as far slower than the incumbent (``stopped_slow``) is evidence that its knob
    values are slow on that hardware: the entry keeps it as a failure with its reason, as it keeps a timeout,
    and never as a winner."""
    base = facts()
    slow, timed_out = cand(16), cand(32)
    trials = [
        *base.trials,
        TrialFact(candidate=slow, status="stopped_slow",
                  reason="stopped_slow: steady steps 3.1x the incumbent's 1.5 s after 6 steps"),
        TrialFact(candidate=timed_out, status="timeout", reason="timeout: 600 s"),
    ]
    entry = distil(StudyFacts(study_id="study-1", meta=META, time_effects=base.time_effects,
                              memory_effects=base.memory_effects, trials=trials,
                              verifications=base.verifications, baseline_step_s=2.0))
    kept = {f.kind: f for f in entry.failures if f.kind in ("timeout", "stopped_slow")}
    assert [f.kind for f in entry.failures][-2:] == ["timeout", "stopped_slow"]
    assert kept["stopped_slow"].candidate == slow and kept["stopped_slow"].detail.startswith("stopped_slow: steady")
    assert kept["timeout"].candidate == timed_out
    assert slow not in entry.winners


def test_distil_is_deterministic_and_the_event_id_follows_the_content() -> None:
    a, b = distil(facts()), distil(facts())
    assert msgspec.json.encode(a) == msgspec.json.encode(b)
    e1, e2 = bank_event(a, cluster_id="cluster-a"), bank_event(b, cluster_id="cluster-a")
    assert e1.event_id == e2.event_id and subjects.subject_for(e1) == f"bank.cluster-a.{a.entry_id}"
    revised = msgspec.structs.replace(a, winners=[cand(4)])
    assert bank_event(revised, cluster_id="cluster-a").event_id != e1.event_id
    assert ev.decode(ev.encode(e1)).payload == a


def test_unverified_study_offers_its_best_measured_candidates() -> None:
    f = StudyFacts(study_id="s", meta=META, time_effects=[], memory_effects=[], trials=facts().trials,
                   baseline_step_s=2.0)
    assert distil(f).winners == [cand(4), cand(2)]
