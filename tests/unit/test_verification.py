"""Verify-stage logic: interleaved plans, paired bootstrap CI, invariants at verify, the state machine."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from infrarsi import events as ev
from infrarsi.verdicts import verification as vf
from infrarsi_services.verifier.logic import VerifierLogic
from support.verified_study import locked_contract

CAND = ev.Candidate(knobs={"micro_batch_size": 8}, patches=["fused-qkv"])
STUDY = "study1"


# --------------------------------------------------------------------------------------------------
# Plans
# --------------------------------------------------------------------------------------------------


def test_plan_round_is_interleaved_and_deterministic():
    plan = vf.plan_round("v1", CAND, round_no=2, repeats=3, steps=400)
    assert [p.arm for p in plan] == ["baseline", "candidate"] * 3
    assert [p.pair for p in plan] == [0, 0, 1, 1, 2, 2]
    assert all(p.payload.kind == "verify" and p.payload.steps == 400 and p.payload.verify_id == "v1" for p in plan)
    assert plan[0].payload.candidate == ev.Candidate() and plan[0].payload.origin == "baseline"
    assert plan[1].payload.candidate_key == CAND.key() and plan[1].payload.origin == "verify"
    assert [p.payload.repeat for p in plan[1::2]] == [3, 4, 5]
    again = vf.plan_round("v1", CAND, round_no=2, repeats=3, steps=400)
    assert [p.trial_id for p in plan] == [p.trial_id for p in again]
    other_round = vf.plan_round("v1", CAND, round_no=3, repeats=3, steps=400)
    assert not {p.trial_id for p in plan} & {p.trial_id for p in other_round}


# --------------------------------------------------------------------------------------------------
# Bootstrap
# --------------------------------------------------------------------------------------------------


def test_bootstrap_constant_ratio_has_zero_width():
    ci = vf.bootstrap_speedup_ci([1.1, 1.21, 1.32], [1.0, 1.1, 1.2])
    assert ci.speedup == pytest.approx(1.1)
    assert ci.low == pytest.approx(1.1) and ci.high == pytest.approx(1.1)


def test_bootstrap_percentile_matches_a_by_hand_resampling():
    a = np.array([1.00, 1.02, 0.99, 1.05])
    b = np.array([0.90, 0.97, 0.95, 0.92])
    ci = vf.bootstrap_speedup_ci(a, b, method="percentile", seed=7, resamples=2000)
    rng = np.random.default_rng(7)
    idx = rng.integers(0, 4, size=(2000, 4))
    boot = np.median(a[idx], axis=1) / np.median(b[idx], axis=1)
    assert ci.speedup == pytest.approx(np.median(a) / np.median(b))
    assert (ci.low, ci.high) == pytest.approx(tuple(np.quantile(boot, [0.025, 0.975])))
    assert ci.method == "percentile"
    # Seeded: same answer twice.
    assert vf.bootstrap_speedup_ci(a, b, method="percentile", seed=7) == ci


def test_bootstrap_three_pairs_lower_bound_is_the_worst_pair():
    # With 3 pairs, P(a resample repeats one pair thrice) = 1/27 > 2.5%: the bound is that pair's ratio.
    ci = vf.bootstrap_speedup_ci([1.0, 1.0, 1.0], [0.90, 0.95, 0.99])
    assert ci.low == pytest.approx(1.0 / 0.99)
    assert ci.high == pytest.approx(1.0 / 0.90)


def test_bca_covers_the_true_ratio_in_most_repetitions():
    rng = np.random.default_rng(11)
    true_speedup, covered = 1.10, 0
    trials = 200
    for i in range(trials):
        drift = 0.03 * rng.standard_normal(10)  # shared by both arms of a pair
        a = np.exp(0.0 + drift + 0.02 * rng.standard_normal(10))
        b = np.exp(-math.log(true_speedup) + drift + 0.02 * rng.standard_normal(10))
        ci = vf.bootstrap_speedup_ci(a, b, method="bca", seed=i, resamples=1000)
        assert ci.method == "bca"
        covered += ci.low <= true_speedup <= ci.high
    assert covered / trials > 0.85  # nominal 95%; medians of 10 with BCa run a little under


# --------------------------------------------------------------------------------------------------
# Invariants and the decision
# --------------------------------------------------------------------------------------------------


def _curve(n=10, start=4.0, bump_at=None, bump=0.0):
    return [ev.LossPoint(s, start * math.exp(-0.1 * s) + (bump if s == bump_at else 0.0)) for s in range(0, n * 10, 10)]


def _run(trial_id, arm, pair, t, *, loss=None, evals=None, opt=100, tokens=100 * 4096, status="ok", invariants=(), mfu=0.3):
    return vf.RunMeasurement(
        trial_id=trial_id, arm=arm, pair=pair, status=status, step_time_s=t, mfu=mfu,
        optimizer_steps=opt, tokens=tokens, loss_curve=tuple(loss or _curve()),
        eval_curve=tuple(evals if evals is not None else [ev.LossPoint(50, 3.0), ev.LossPoint(100, 2.5)]),
        invariants=tuple(invariants),
    )


def _round(pairs, **cand_kwargs):
    r = vf.Round("v1", CAND, 1, len(pairs))
    for i, (a, b) in enumerate(pairs):
        r.runs[f"a{i}"] = _run(f"a{i}", "baseline", i, a)
        r.runs[f"b{i}"] = _run(f"b{i}", "candidate", i, b, **cand_kwargs)
    return r


RULE = vf.LossRule(tolerance=0.02, mode="relative")


def test_decide_passes_a_clear_speedup():
    done = vf.decide(_round([(1.0, 0.80), (1.02, 0.81), (0.99, 0.79)]), passes_before=0, passes_required=2, loss_rule=RULE)
    assert done.speedup == pytest.approx(1.0 / 0.80)
    assert done.ci_low > 1.0 and done.passes == 1 and not done.promotable
    assert done.failed_invariants == []
    assert {i.name for i in done.invariants} >= {"loss", "work.optimizer_steps", "work.tokens", "work.eval"}
    assert done.mfu_before == pytest.approx(0.3)
    assert vf.round_passed(done) and not vf.is_final(done)
    second = vf.decide(_round([(1.0, 0.8)] * 3), passes_before=1, passes_required=2, loss_rule=RULE)
    assert second.passes == 2 and second.promotable and vf.is_final(second)


def test_decide_names_a_mid_curve_loss_divergence():
    # Same final loss, but 10% off at step 40: "within ε at every checkpoint, not just at the end".
    bad = _curve(bump_at=40, bump=0.25)
    done = vf.decide(_round([(1.0, 0.8)] * 3, loss=bad), passes_before=0, passes_required=2, loss_rule=RULE)
    assert done.failed_invariants == ["loss"]
    loss = next(i for i in done.invariants if i.name == "loss")
    assert "step 40" in loss.detail and not loss.ok
    assert done.passes == 0 and not done.promotable


def test_decide_names_work_and_telemetry_violations_and_crashes():
    timing_bad = ev.InvariantResult(name="timing", ok=False, detail="wall 12% off")
    done = vf.decide(
        _round([(1.0, 0.8)] * 2, opt=99, tokens=99 * 4096, evals=[ev.LossPoint(50, 3.0)], invariants=[timing_bad]),
        passes_before=0, passes_required=2, loss_rule=RULE,
    )
    assert done.failed_invariants == ["timing", "work.eval", "work.optimizer_steps", "work.tokens"]
    crash = _round([(1.0, 0.8)] * 2)
    crash.runs["b1"] = vf.RunMeasurement(trial_id="b1", arm="candidate", pair=1, status="crash", reason="exit 1")
    done = vf.decide(crash, passes_before=0, passes_required=2, loss_rule=RULE)
    assert done.failed_invariants == ["run.crash"]
    assert done.speedup == pytest.approx(1.25)  # from the one complete pair


def test_decide_fails_when_ci_includes_one():
    done = vf.decide(_round([(1.0, 0.95), (1.0, 1.04), (1.0, 0.97)]), passes_before=0, passes_required=2, loss_rule=RULE)
    assert done.ci_low <= 1.0 and done.failed_invariants == [] and done.passes == 0


def test_select_candidates_ranks_and_disqualifies():
    def pm(key_knob, t, ok=True, status="ok", kind="search"):
        cand = ev.Candidate(knobs={"mb": key_knob})
        prop = ev.TrialProposed(candidate=cand, candidate_key=cand.key(), kind=kind, origin="ei")
        meas = ev.TrialMeasured(
            candidate_key=cand.key(), kind=kind, status=status, steps=10, warmup_steps=1, step_time_s=t,
            step_time_mad_s=0.0, step_time_with_warmup_s=t, tokens_per_s=1.0, mfu=None, flops_per_step=None,
            phases={}, peak_memory_bytes=[1], per_rank_step_s=[t], stragglers=[], loss_curve=[], eval_curve=[],
            optimizer_steps=10, tokens=10, invariants=[], invariants_ok=ok,
        )
        return (f"t{key_knob}{t}", prop, meas)

    runs = [pm(1, 0.9), pm(1, 0.7), pm(1, 0.8), pm(2, 0.5, ok=False), pm(2, 0.5), pm(3, 0.85), pm(4, 1.2), pm(5, 0.1, status="oom"),
            pm(6, 0.2, kind="verify")]
    top = vf.select_candidates(runs, 5, baseline_step_s=1.0)
    assert [(r.candidate.knobs["mb"], r.step_time_s, r.runs) for r in top] == [(1, 0.8, 3), (3, 0.85, 1)]


# --------------------------------------------------------------------------------------------------
# The verifier state machine
# --------------------------------------------------------------------------------------------------


def _env(payload, trial_id=None, event_id=None):
    return ev.make_event(payload, study_id=STUDY, source="test", trial_id=trial_id, event_id=event_id)


def _measured(proposed: ev.TrialProposed, t: float, *, loss=None):
    return ev.TrialMeasured(
        candidate_key=proposed.candidate_key, kind="verify", status="ok", steps=100, warmup_steps=2,
        step_time_s=t, step_time_mad_s=0.001, step_time_with_warmup_s=t, tokens_per_s=4096 / t,
        mfu=0.1 / t, flops_per_step=1e9, phases={}, peak_memory_bytes=[1 << 30], per_rank_step_s=[t],
        stragglers=[], loss_curve=loss or _curve(), eval_curve=[ev.LossPoint(50, 3.0)], optimizer_steps=100,
        tokens=100 * 4096, invariants=[ev.InvariantResult(name="timing", ok=True, detail="ok")], invariants_ok=True,
    )


def _contract():
    """A locked contract (what ``init`` puts in StudyCreated) whose verify rules are the ones under test."""
    return locked_contract(steps=200, verify_steps=400, verify={"repeats": 3, "passes_required": 2, "top_k": 1},
                           loss={"tolerance": 0.02, "mode": "relative"})


def _study_created():
    return ev.StudyCreated(
        name="s", goal="g", contract=_contract(), contract_sha256="x", workload_dir="/w", baseline_ref="abc",
        locked_files={}, cluster=ev.ClusterInfo(cluster_id="local", accelerator="cpu"),
    )


def _drive(logic, proposals, speed, loss=None):
    out = []
    for e in proposals:
        t = 1.0 if e.payload.candidate_key == ev.Candidate().key() else 1.0 / speed
        out += logic.apply(_env(_measured(e.payload, t, loss=loss if e.payload.origin == "verify" else None), trial_id=e.trial_id))
    return out


def test_state_machine_two_rounds_to_promotable_and_replay_is_idempotent():
    logic = VerifierLogic()
    events_seen = [_env(_study_created())]
    logic.apply(events_seen[0])
    request = _env(ev.VerifyRequested(candidates=[CAND], repeats=3), event_id="req1")
    round1 = logic.apply(request)
    assert len(round1) == 6 and all(isinstance(e.payload, ev.TrialProposed) for e in round1)
    assert round1[0].payload.steps == 400 and round1[0].key == round1[0].trial_id
    # Redelivery of the request: same emissions, no new state.
    assert logic.apply(request) == round1
    out = _drive(logic, round1, speed=1.2)
    first = out[0].payload
    assert isinstance(first, ev.VerifyCompleted) and first.passes == 1 and not first.promotable
    assert first.verify_id == vf.verify_id_for("req1", CAND.key())
    round2 = out[1:]
    assert len(round2) == 6 and not {e.trial_id for e in round2} & {e.trial_id for e in round1}
    out2 = _drive(logic, round2, speed=1.2)
    assert len(out2) == 1
    final = out2[0].payload
    assert final.promotable and final.passes == 2 and final.speedup == pytest.approx(1.2)
    assert final.mfu_after == pytest.approx(0.12) and final.mfu_before == pytest.approx(0.1)
    # Late duplicate report of a decided run: nothing.
    assert _drive(logic, round2[:1], speed=1.2) == []


def test_state_machine_stops_after_a_failing_round_and_names_the_invariant():
    logic = VerifierLogic()
    logic.apply(_env(_study_created()))
    round1 = logic.apply(_env(ev.VerifyRequested(candidates=[CAND], repeats=3)))
    out = _drive(logic, round1, speed=1.3, loss=_curve(bump_at=70, bump=0.5))
    assert len(out) == 1
    done = out[0].payload
    assert done.failed_invariants == ["loss"] and done.passes == 0 and not done.promotable
    assert vf.is_final(done)
    assert logic.status()["active"] == 0


def test_state_machine_counts_a_crashed_run_from_trial_finished():
    logic = VerifierLogic()
    logic.apply(_env(_study_created()))
    round1 = logic.apply(_env(ev.VerifyRequested(candidates=[CAND], repeats=1)))
    base, cand = round1
    assert logic.apply(_env(_measured(base.payload, 1.0), trial_id=base.trial_id)) == []
    assert logic.apply(_env(ev.TrialFinished(status="ok"), trial_id=cand.trial_id)) == []
    out = logic.apply(_env(ev.TrialFinished(status="oom", reason="rss over capacity"), trial_id=cand.trial_id))
    assert out[0].payload.failed_invariants == ["run.oom"]
    # Unrelated trials are ignored.
    assert logic.apply(_env(_measured(base.payload, 1.0), trial_id="someone-else")) == []


def test_a_run_the_harness_lost_is_run_again_instead_of_failing_the_round():
    """The stack killed under a verification: the restarted launcher reports the run ``cancelled`` as the
    harness's failure. The round plans the same run once more (same arm and pair) and is decided by the re-run;
    a second loss of the same run counts as the failure it is; a cancelled study's runs are not re-run."""
    logic = VerifierLogic()
    logic.apply(_env(_study_created()))
    base, cand = logic.apply(_env(ev.VerifyRequested(candidates=[CAND], repeats=1)))
    assert logic.apply(_env(_measured(base.payload, 1.0), trial_id=base.trial_id)) == []
    lost = ev.TrialFinished(status="cancelled", infrastructure=True, accelerator_s=3.0,
                            reason="the launcher was stopped or killed mid-trial; its processes were reaped")
    lost_event = _env(lost, trial_id=cand.trial_id)
    [again] = logic.apply(lost_event)
    assert again.trial_id == ev.derived_id(cand.trial_id, "rerun") and again.payload.retry_of == cand.trial_id
    assert again.payload.candidate == CAND and again.payload.origin == "verify" and again.payload.steps == 400
    assert logic.apply(lost_event) == [again]  # redelivered: the same re-run
    assert logic.apply(_env(lost, trial_id=cand.trial_id)) == []  # a second report of the loss: nothing more
    # the lost run's late TrialMeasured (telemetry's, of what it ran) decides nothing
    assert logic.apply(_env(_measured(cand.payload, 0.5), trial_id=cand.trial_id)) == []
    done, *round2 = logic.apply(_env(_measured(again.payload, 1.0 / 1.3), trial_id=again.trial_id))
    assert done.payload.passes == 1 and not done.payload.failed_invariants and len(round2) == 2  # 2 passes required
    assert done.payload.speedup == pytest.approx(1.3)

    # lost twice: the re-run's loss is the result
    logic = VerifierLogic()
    logic.apply(_env(_study_created()))
    base, cand = logic.apply(_env(ev.VerifyRequested(candidates=[CAND], repeats=1)))
    logic.apply(_env(_measured(base.payload, 1.0), trial_id=base.trial_id))
    [again] = logic.apply(_env(lost, trial_id=cand.trial_id))
    [done] = logic.apply(_env(lost, trial_id=again.trial_id))
    assert done.payload.failed_invariants == ["run.cancelled"] and not done.payload.promotable

    # a study cancelled: its runs end cancelled (infrastructure too) and nothing is run again
    logic = VerifierLogic()
    logic.apply(_env(_study_created()))
    base, cand = logic.apply(_env(ev.VerifyRequested(candidates=[CAND], repeats=1)))
    logic.apply(_env(ev.StudyCancelled(reason="budget", by="t@h")))
    assert logic.apply(_env(lost, trial_id=cand.trial_id)) == []


# --------------------------------------------------------------------------------------------------
# Divergence over the horizon (loss.trend)
# --------------------------------------------------------------------------------------------------


def _long_curve(n=60, start=4.0):
    return [ev.LossPoint(s, start * math.exp(-0.02 * s) + 1.0) for s in range(1, n + 1)]


def _scaled(curve, gap_in_eps):
    """The curve with each point moved by ``gap_in_eps(i, step)`` × ε (RULE: 2% of the point's loss)."""
    return [ev.LossPoint(p.step, p.loss * (1 + RULE.tolerance * gap_in_eps(i, p.step))) for i, p in enumerate(curve)]


def _round_vs(base, cand, n_pairs=3):
    r = vf.Round("v1", CAND, 1, n_pairs)
    for i in range(n_pairs):
        r.runs[f"a{i}"] = _run(f"a{i}", "baseline", i, 1.0, loss=base)
        r.runs[f"b{i}"] = _run(f"b{i}", "candidate", i, 0.8, loss=cand)
    return r


def test_gap_trend_of_an_exact_line_is_its_slope_and_extrapolation():
    base = _long_curve(n=50)
    cand = _scaled(base, lambda i, s: 0.01 * s)  # gap/ε = step/100: 0.5 at step 50
    fit = vf.gap_trend(base, cand, RULE, vf.TrendRule())
    assert fit is not None and fit.points == 50
    assert fit.slope_per_step == pytest.approx(0.01)
    assert fit.gap_last == pytest.approx(0.5)
    assert fit.projected_step == 100 and fit.projected_gap == pytest.approx(1.0)
    assert fit.p_value < 1e-9  # an exact line: the slope away from zero is certain
    assert fit.diverges(vf.TrendRule(alpha=0.05)) is (fit.projected_gap > 1.0)
    # Just under ε at twice the horizon holds; the same line at three times the horizon fails.
    under = vf.gap_trend(base, _scaled(base, lambda i, s: 0.0099 * s), RULE, vf.TrendRule())
    assert under.projected_gap == pytest.approx(0.99) and not under.diverges(vf.TrendRule())
    assert vf.gap_trend(base, cand, RULE, vf.TrendRule(horizon_multiple=3.0)).diverges(vf.TrendRule())
    # A flat gap, however close to ε, is no trend.
    flat = vf.gap_trend(base, _scaled(base, lambda i, s: 0.95), RULE, vf.TrendRule())
    assert flat.slope_per_step == pytest.approx(0.0, abs=1e-12) and not flat.diverges(vf.TrendRule())


def test_gap_trend_slope_test_matches_scipy_linregress():
    from scipy import stats

    rng = np.random.default_rng(3)
    base = _long_curve(n=40)
    noise = rng.normal(0.0, 0.1, size=40)
    cand = _scaled(base, lambda i, s: 0.004 * s + noise[i])
    fit = vf.gap_trend(base, cand, RULE, vf.TrendRule())
    gaps = [(c.loss - b.loss) / RULE.allowed(b.loss) for b, c in zip(base, cand, strict=True)]
    ref = stats.linregress([p.step for p in base], gaps)
    assert fit.slope_per_step == pytest.approx(ref.slope)
    # linregress's p is two-sided; the slope is positive and so is the projection: one-sided = half.
    assert fit.p_value == pytest.approx(ref.pvalue / 2, rel=1e-6)


def test_decide_fails_a_slow_drift_that_stays_inside_epsilon_at_every_point():
    # The planted drift: the gap grows 0.012 ε a step, 0.72 ε at the last step (inside ε everywhere, so
    # ``loss`` holds) and would cross ε at step ~83 — before twice the horizon (120).
    rng = np.random.default_rng(5)
    base = _long_curve()
    noise = rng.normal(0.0, 0.05, size=len(base))
    drift = _scaled(base, lambda i, s: 0.012 * s + noise[i])
    assert all(abs(c.loss - b.loss) < RULE.allowed(b.loss) for b, c in zip(base, drift, strict=True))
    done = vf.decide(_round_vs(base, drift), passes_before=0, passes_required=1, loss_rule=RULE)
    assert done.failed_invariants == ["loss.trend"] and not done.promotable
    trend = next(i for i in done.invariants if i.name == "loss.trend")
    assert "projected" in trend.detail and trend.observed > 1.0 and trend.tolerance == 1.0
    # The same round without the trend check passes: only loss.trend catches it.
    off = vf.LossRule(tolerance=RULE.tolerance, mode=RULE.mode, trend=None)
    assert vf.decide(_round_vs(base, drift), passes_before=0, passes_required=1, loss_rule=off).promotable


def test_honest_candidates_pass_the_trend_check():
    base = _long_curve()
    # Bitwise equal, a constant offset near ε, and noise of 0.3 ε without a trend.
    flat = _scaled(base, lambda i, s: 0.9)
    assert vf.decide(_round_vs(base, base), passes_before=0, passes_required=1, loss_rule=RULE).promotable
    assert vf.decide(_round_vs(base, flat), passes_before=0, passes_required=1, loss_rule=RULE).promotable
    rng = np.random.default_rng(9)
    false_alarms = 0
    for _ in range(200):
        noise = rng.normal(0.0, 0.3, size=len(base))
        fit = vf.gap_trend(base, _scaled(base, lambda i, s, n=noise: n[i]), RULE, vf.TrendRule())
        false_alarms += fit.diverges(vf.TrendRule())
    assert false_alarms <= 4  # needs both a significant slope and a projected gap past ε


def test_too_few_compared_steps_leave_the_trend_unchecked_by_name():
    short = _curve(n=4)  # 4 points < min_points
    done = vf.decide(_round_vs(short, short), passes_before=0, passes_required=1, loss_rule=RULE)
    assert "loss.trend" in done.unchecked_invariants
    assert "loss.trend" not in {i.name for i in done.invariants}


def test_contract_trend_settings_reach_the_verifier_and_null_turns_the_check_off():
    from infrarsi.study.contract import Contract
    from infrarsi_services.verifier.logic import StudyRules

    contract = Contract.model_validate(_contract())
    assert StudyRules.from_contract(contract).loss_rule.trend == vf.TrendRule()  # the default: on, 2×, 5%
    raw = _contract()
    raw["invariants"]["loss"]["trend"] = {"horizon_multiple": 3, "alpha": 0.01, "min_points": 10}
    assert vf.loss_rule_of(Contract.model_validate(raw).invariants).trend == vf.TrendRule(3.0, 0.01, 10)
    raw["invariants"]["loss"]["trend"] = None
    assert StudyRules.from_contract(Contract.model_validate(raw)).loss_rule.trend is None


def test_predicted_verify_cost_is_doctor_step_time_times_steps_times_runs():
    from infrarsi.study.contract import Contract

    contract = Contract.model_validate(_contract())  # top 1, 2 passes, 3 pairs, verify_steps 400, 1 rank
    cost = vf.predicted_verify_cost(contract, 0.05)
    assert cost.runs == 1 * 2 * 3 * 2
    assert cost.accelerator_s == pytest.approx(12 * 400 * 0.05)
    assert "= 240 accelerator-s" in cost.line() and "400 steps" in cost.line()
    assert vf.predicted_verify_cost(contract, 0.05, candidates=3, repeats=1).accelerator_s == pytest.approx(3 * 2 * 1 * 2 * 400 * 0.05)


# --------------------------------------------------------------------------------------------------
# Numeric parity modes (loss.parity, parity.deterministic)
# --------------------------------------------------------------------------------------------------

TIGHT = vf.LossRule(tolerance=0.02, mode="relative", parity=vf.ParityRule("tight", max_abs=1e-6, max_rel=1e-4))
BITWISE = vf.LossRule(tolerance=0.02, mode="relative", parity=vf.ParityRule("bitwise"))


def _pair_round(base, cand, *, det=(True, True), n_pairs=2):
    r = vf.Round("v1", CAND, 1, n_pairs)
    for i in range(n_pairs):
        r.runs[f"a{i}"] = dataclasses.replace(_run(f"a{i}", "baseline", i, 1.0, loss=base), deterministic=det[0])
        r.runs[f"b{i}"] = dataclasses.replace(_run(f"b{i}", "candidate", i, 0.8, loss=cand), deterministic=det[1])
    return r


def _decide(round_, rule):
    return vf.decide(round_, passes_before=0, passes_required=1, loss_rule=rule)


def test_tight_parity_names_a_deviation_inside_epsilon_but_outside_its_tolerance():
    base = _long_curve()
    off = [ev.LossPoint(p.step, p.loss * (1 + 1e-3)) for p in base]  # 0.1 %: inside ε (2 %), outside 1e-4
    done = _decide(_pair_round(base, off), TIGHT)
    assert done.failed_invariants == ["loss.parity"] and not done.promotable
    parity = next(i for i in done.invariants if i.name == "loss.parity")
    assert "max relative 0.001" in parity.detail and "first out: train step 1" in parity.detail
    assert _decide(_pair_round(base, off), RULE).promotable  # without parity: only loss (ε) applies, and holds
    # Last-bit noise (1e-7 relative) is tight enough.
    fuzz = [ev.LossPoint(p.step, p.loss * (1 + 1e-7)) for p in base]
    tight_ok = _decide(_pair_round(base, fuzz), TIGHT)
    assert tight_ok.failed_invariants == [] and any(i.name == "loss.parity" and i.ok for i in tight_ok.invariants)


def test_tight_parity_rule_is_abs_plus_rel_at_every_step_evals_included():
    base = [ev.LossPoint(s, 2.0) for s in range(1, 11)]
    rule = vf.ParityRule("tight", max_abs=1e-3, max_rel=1e-3)  # allowed 1e-3 + 2e-3 = 3e-3 at loss 2
    at_edge = vf.RunMeasurement("b", "candidate", 0, "ok", loss_curve=tuple(ev.LossPoint(s, 2.0029) for s in range(1, 11)))
    past = vf.RunMeasurement("b", "candidate", 0, "ok", loss_curve=tuple(ev.LossPoint(s, 2.0031) for s in range(1, 11)))
    a = vf.RunMeasurement("a", "baseline", 0, "ok", loss_curve=tuple(base))
    assert vf._parity_check(a, at_edge, rule).ok and not vf._parity_check(a, past, rule).ok
    a_eval = dataclasses.replace(a, eval_curve=(ev.LossPoint(5, 3.0),))
    assert not vf._parity_check(a_eval, at_edge, rule).ok  # the eval at step 5 is missing from the candidate
    b_eval = dataclasses.replace(at_edge, eval_curve=(ev.LossPoint(5, 3.01),))
    check = vf._parity_check(a_eval, b_eval, rule)
    assert not check.ok and "eval step 5" in check.detail


def test_bitwise_parity_fails_last_bit_noise_and_a_run_without_determinism_by_name():
    base = _long_curve()
    same = list(base)
    assert _decide(_pair_round(base, same), BITWISE).promotable
    fuzz = [ev.LossPoint(p.step, float(np.nextafter(p.loss, np.inf))) if p.step == 30 else p for p in base]
    done = _decide(_pair_round(base, fuzz), BITWISE)
    assert done.failed_invariants == ["loss.parity"]  # one ulp at one step
    assert "first out: train step 30" in next(i for i in done.invariants if i.name == "loss.parity").detail
    tight = _decide(_pair_round(base, fuzz), TIGHT)
    assert tight.promotable  # tight lets the same ulp through, and says how close it came
    held = next(i for i in tight.invariants if i.name == "loss.parity")
    assert held.ok and "held on 2 checks; closest: pair 1: tight: max |Δ|" in held.detail and held.observed > 0
    refused = _decide(_pair_round(base, same, det=(True, False)), BITWISE)
    assert refused.failed_invariants == ["parity.deterministic"] and not refused.promotable
    det = next(i for i in refused.invariants if i.name == "parity.deterministic")
    assert "candidate had them off at some step" in det.detail
    silent = _decide(_pair_round(base, same, det=(True, None)), BITWISE)
    assert silent.failed_invariants == ["parity.deterministic"]
    # Off by default: no parity rows, and determinism is not asked for.
    plain = _decide(_pair_round(base, fuzz, det=(None, None)), RULE)
    assert plain.promotable and not {"loss.parity", "parity.deterministic"} & {i.name for i in plain.invariants}


def test_contract_parity_reaches_the_verifier_and_defaults_to_none():
    from infrarsi.study.contract import Contract
    from infrarsi_services.verifier.logic import StudyRules

    assert StudyRules.from_contract(Contract.model_validate(_contract())).loss_rule.parity.mode == "none"
    raw = _contract()
    raw["invariants"].update(parity="tight", parity_tight={"max_abs": 0.0, "max_rel": 1e-5})
    assert vf.loss_rule_of(Contract.model_validate(raw).invariants).parity == vf.ParityRule("tight", 0.0, 1e-5)
    raw["invariants"]["parity"] = "exact"
    with pytest.raises(ValueError, match="parity"):
        Contract.model_validate(raw)
