"""Coarse measurement, the pure parts: counting steps in a job's output, the measurement telemetry makes of
a TrialFinished alone, and a verification round of coarse runs naming what it could not check."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from infrarsi import events as ev
from infrarsi.study.contract import MeasurementSpec
from infrarsi.verdicts import stats
from infrarsi.verdicts import verification as vf
from infrarsi_services.launcher.output import OutputSteps, OutputTail
from pydantic import ValidationError


def counted(pattern: str, text: str) -> OutputSteps:
    counter = OutputSteps(pattern)
    counter.feed_text(text, 1.0)
    return counter


def test_count_rules() -> None:
    tqdm = "  0%|          | 0/30 [00:00<?, ?it/s]\r 40%|████      | 12/30 [00:05<00:07]\r100%|██████████| 30/30 [00:12<00:00]\n"
    assert counted(r"(?P<step>\d+)/\d+ \[", tqdm).steps_done == 30  # a progress bar redrawn with \r
    assert counted(r"^step (?P<index>\d+)", "step 0 loss 1\nstep 1 loss 1\nstep 2 loss 1\n").steps_done == 3
    assert counted(r"loss=", "loss=1\nnoise\nloss=2\n").steps_done == 2  # no group: one step per line
    # a second epoch's bar counts from 0 again: the count does not go back
    assert counted(r"(?P<step>\d+)/\d+ \[", "10/10 [\n3/10 [\n").steps_done == 10


PLAIN_LOGS = {
    "counted from 0": "".join(f"step {i} | loss 5.1 | 300.2 ms\n" for i in range(30)),
    "counted from 1, with the horizon": "".join(f"Step {i}/30, loss=5.1\n" for i in range(1, 31)),
    "nanoGPT's": "".join(f"iter {i}: loss 5.1, time 300.00ms, mfu 1.0%\n" for i in range(30)),
    "key=value": "".join(f"step={i + 1} loss=5.1\n" for i in range(30)),
    "eval lines and the arguments among them": "Namespace(max_steps=30, eval_every=10)\ntotal steps: 30\n"
    + "".join(f"step {i} loss 5.1\n" + (f"step {i}: val loss 5.0\n" if i % 10 == 9 else "") for i in range(30)),
}


@pytest.mark.parametrize("log", sorted(PLAIN_LOGS))
def test_the_scaffolds_plain_pattern_counts_a_loss_line_per_step(log: str) -> None:
    from infrarsi.study.scaffold import default_step_regex

    assert counted(default_step_regex("plain"), PLAIN_LOGS[log]).steps_done == 30
    # a loop stopped early shows it
    short = PLAIN_LOGS[log].splitlines()[: len(PLAIN_LOGS[log].splitlines()) // 2]
    assert counted(default_step_regex("plain"), "\n".join(short)).steps_done < 30


def test_number_group_takes_its_base_from_the_first_number() -> None:
    assert counted(r"step (?P<number>\d+)", "step 0\nstep 1\nstep 2\n").steps_done == 3
    assert counted(r"step (?P<number>\d+)", "step 1\nstep 2\nstep 3\n").steps_done == 3
    assert counted(r"step (?P<number>\d+)", "step 0\nstep 9\nstep 9\n").steps_done == 10  # a repeated line


def test_tail_counts_complete_lines_as_they_appear(tmp_path: Path) -> None:
    log = tmp_path / "node0.log"
    tail = OutputTail(log, 0.0, OutputSteps(r"^step (?P<index>\d+)"))
    tail.poll()
    assert not tail.read_any
    log.write_text("step 0\nstep 1")  # the second line is not finished yet
    tail.poll()
    assert tail.counter.steps_done == 1
    tail.poll(final=True)  # the job ended: an unterminated last line counts
    assert tail.counter.steps_done == 2 and [s.steps_done for s in tail.counter.seen] == [1, 2]


def test_step_regex_is_validated() -> None:
    with pytest.raises(ValidationError, match="not a regular expression"):
        MeasurementSpec(kind="coarse", step_regex="(unclosed")
    with pytest.raises(ValidationError, match="only used with kind: coarse"):
        MeasurementSpec(kind="probe", step_regex="x")


SPEC = stats.InvariantSpec(loss_tolerance=0.05)


def finished(*, steps: int, seen: list[tuple[int, float]], wall: float = 10.0, status: ev.TrialStatus = "ok") -> ev.TrialFinished:
    return ev.TrialFinished(
        status=status, wall_s=wall, accelerator_s=wall, peak_memory_bytes=123 << 20, steps_completed=steps,
        output_steps=[ev.OutputStep(steps_done=n, seen_s=t) for n, t in seen],
    )  # fmt: skip


def test_step_time_from_counts_excludes_start_up() -> None:
    # first count at 4 s (imports, model build), then 2 steps a second
    f = finished(steps=20, seen=[(1, 4.0), (10, 8.5), (20, 13.5)], wall=14.0)
    steady, with_warmup, warmup = stats.coarse_step_time(f, 20)
    assert steady == pytest.approx(0.5) and with_warmup == pytest.approx(0.7) and warmup == 1
    # only the output's tail was read (no times): the whole run over the steps
    assert stats.coarse_step_time(finished(steps=20, seen=[(20, -1.0)], wall=14.0), 20)[0] == pytest.approx(0.7)


def test_measure_coarse_checks_what_it_can_and_names_the_rest() -> None:
    m = stats.measure_coarse(finished(steps=20, seen=[(1, 1.0), (20, 10.5)]), candidate_key="k", kind="search",
                             horizon=20, spec=SPEC, counts_steps=True, is_baseline=False)  # fmt: skip
    assert m.coarse and m.status == "ok" and m.invariants_ok
    assert [i.name for i in m.invariants] == ["scope", "work.optimizer_steps"]
    assert [u.name for u in m.unchecked_invariants] == ["work.tokens", "work.eval", "loss", "timing"]
    assert m.peak_memory_bytes == [123 << 20] and m.mfu is None and m.tokens == 0
    short = stats.measure_coarse(finished(steps=10, seen=[(1, 1.0), (10, 5.5)]), candidate_key="k", kind="search",
                                 horizon=20, spec=SPEC, counts_steps=True, is_baseline=False)  # fmt: skip
    assert short.status == "invariant_violation" and not short.invariants_ok
    crashed = stats.measure_coarse(finished(steps=3, seen=[], status="crash"), candidate_key="k", kind="search",
                                   horizon=20, spec=SPEC, counts_steps=True, is_baseline=False)  # fmt: skip
    assert crashed.status == "crash" and not crashed.invariants_ok and crashed.step_time_s == 0.0


def _coarse_run(trial_id: str, arm: vf.Arm, pair: int, t: float, steps: int = 20, *, counted: bool = True) -> vf.RunMeasurement:
    unchecked = ("work.tokens", "work.eval", "loss", "timing") + (() if counted else ("work.optimizer_steps",))
    checks = (ev.InvariantResult(name="scope", ok=True, detail="in scope"),)
    return vf.RunMeasurement(trial_id=trial_id, arm=arm, pair=pair, status="ok", step_time_s=t, optimizer_steps=steps,
                             tokens=0, invariants=checks, coarse=True, unchecked=unchecked)  # fmt: skip


def _round(runs: list[vf.RunMeasurement]) -> vf.Round:
    r = vf.Round("v1", ev.Candidate(knobs={"x": 1}), 1, len(runs) // 2)
    r.runs = {run.trial_id: run for run in runs}
    return r


RULE = vf.LossRule(tolerance=0.02, mode="relative")


def test_a_coarse_round_names_unchecked_invariants_and_never_compares_empty_curves() -> None:
    runs = [_coarse_run(f"{arm}{i}", arm, i, t) for i in range(3) for arm, t in (("baseline", 1.0), ("candidate", 0.8))]
    done = vf.decide(_round(runs), passes_before=0, passes_required=1, loss_rule=RULE)
    assert done.unchecked_invariants == ["loss", "loss.trend", "timing", "work.eval", "work.tokens"]
    assert {i.name for i in done.invariants} == {"scope", "work.optimizer_steps"}  # no "loss ok" from empty curves
    assert done.promotable and done.speedup == pytest.approx(1.25)
    # a candidate that stopped early is caught by the counted steps
    runs[1] = _coarse_run("candidate0", "candidate", 0, 0.8, steps=10)
    bad = vf.decide(_round(runs), passes_before=0, passes_required=1, loss_rule=RULE)
    assert bad.failed_invariants == ["work.optimizer_steps"] and not bad.promotable
    # not counted at all: the step count is unchecked too, not compared as 0 == 0
    uncounted = [_coarse_run(f"{a}{i}", a, i, t, steps=0, counted=False) for i in range(2) for a, t in (("baseline", 1.0), ("candidate", 0.8))]
    done = vf.decide(_round(uncounted), passes_before=0, passes_required=1, loss_rule=RULE)
    assert "work.optimizer_steps" in done.unchecked_invariants
    assert {i.name for i in done.invariants} == {"scope"}


# --------------------------------------------------------------------------------------------------
# The golden baseline defines the work; the loss and step times come from the log (issue 35)
# --------------------------------------------------------------------------------------------------


def logged(*, steps: int, losses: list[float], printed_s: float = 0.5, eval_every: int = 0, wall: float = 20.0) -> ev.TrialFinished:
    """A coarse run whose output counted ``steps`` (one a second after 1 s) and printed these losses."""
    return msgspec.structs.replace(
        finished(steps=steps, seen=[(n, 1.0 + 0.5 * (n - 1)) for n in range(1, steps + 1)], wall=wall),
        output_losses=[ev.LossPoint(n, loss) for n, loss in enumerate(losses, 1)],
        output_eval_losses=[ev.LossPoint(n, losses[n - 1]) for n in range(1, steps + 1, eval_every)] if eval_every else [],
        output_step_times=[ev.PrintedStepTime(1.0 + 0.5 * (n - 1), printed_s) for n in range(1, steps + 1)],
    )  # fmt: skip


EVERY_STEP = stats.InvariantSpec(loss_tolerance=0.05, loss_at="every_step")


def coarse(f: ev.TrialFinished, *, baseline: ev.TrialMeasured | None = None, horizon: int = 30,
           kind: ev.TrialKind = "search") -> ev.TrialMeasured:  # fmt: skip
    return stats.measure_coarse(f, candidate_key="k", kind=kind, horizon=horizon, spec=EVERY_STEP, counts_steps=True,
                                is_baseline=kind in ("baseline", "doctor"), baseline=baseline)  # fmt: skip


def test_the_untouched_baseline_defines_the_work_it_is_never_rejected_for() -> None:
    # nanoGPT runs max_iters + 1 iterations: 31 counted at a horizon of 30
    base = coarse(logged(steps=31, losses=[4.0 - n / 100 for n in range(31)]), kind="baseline")
    steps = {i.name: i for i in base.invariants}["work.optimizer_steps"]
    assert base.status == "ok" and steps.ok and "defines the work" in steps.detail, steps
    # a candidate doing the same work passes; one stopping at the contract's horizon does not
    same = coarse(logged(steps=31, losses=[4.0 - n / 100 for n in range(31)]), baseline=base)
    assert same.status == "ok", same.invariants
    assert "the golden baseline counted 31 at horizon 30" in {i.name: i for i in same.invariants}["work.optimizer_steps"].detail
    short = coarse(logged(steps=30, losses=[4.0 - n / 100 for n in range(30)]), baseline=base)
    assert short.status == "invariant_violation"
    assert [i.name for i in short.invariants if not i.ok] == ["work.optimizer_steps"]
    # a baseline that counted nothing defines nothing
    assert coarse(logged(steps=0, losses=[]), kind="baseline").status == "invariant_violation"


def test_the_loss_read_from_the_log_is_checked_against_the_baselines() -> None:
    curve = [4.0 - n / 100 for n in range(31)]
    base = coarse(logged(steps=31, losses=curve), kind="baseline")
    assert base.loss_from_log and base.loss_curve[0] == ev.LossPoint(1, 4.0)
    same = coarse(logged(steps=31, losses=[v * 1.01 for v in curve]), baseline=base)
    loss = {i.name: i for i in same.invariants}["loss"]
    assert loss.ok and "read from the job's log" in loss.detail and same.loss_from_log
    assert "loss" not in {u.name for u in same.unchecked_invariants}
    drifted = coarse(logged(steps=31, losses=curve[:20] + [v * 1.2 for v in curve[20:]]), baseline=base)
    assert drifted.status == "invariant_violation" and [i.name for i in drifted.invariants if not i.ok] == ["loss"]
    # a job that prints no loss leaves it unchecked, by name
    silent = coarse(msgspec.structs.replace(logged(steps=31, losses=curve), output_losses=[]), baseline=base)
    assert "no loss read from the job's output" in {u.name: u.reason for u in silent.unchecked_invariants}["loss"]


def test_printed_step_times_are_held_against_the_launchers_clock() -> None:
    base = coarse(logged(steps=31, losses=[4.0] * 31, printed_s=0.5), kind="baseline")  # launcher: 0.5 s/step
    timing = {i.name: i for i in base.invariants}["timing"]
    assert timing.ok and timing.observed == pytest.approx(1.0), timing
    # a job whose printed times undercount the step (a clock that skips part of it) is caught
    lying = coarse(logged(steps=31, losses=[4.0] * 31, printed_s=0.3), baseline=base)
    assert lying.status == "invariant_violation" and [i.name for i in lying.invariants if not i.ok] == ["timing"]
    # nothing printed: unchecked, by name
    quiet = coarse(msgspec.structs.replace(logged(steps=31, losses=[4.0] * 31), output_step_times=[]), baseline=base)
    assert "timing" in {u.name for u in quiet.unchecked_invariants}


def test_a_coarse_verify_round_compares_the_logged_loss() -> None:
    curve = tuple(ev.LossPoint(n, 4.0 - n / 100) for n in range(1, 21))

    def run(trial_id: str, arm: vf.Arm, pair: int, t: float, scale: float) -> vf.RunMeasurement:
        checks = (ev.InvariantResult(name="scope", ok=True, detail="in scope"),)
        return vf.RunMeasurement(trial_id=trial_id, arm=arm, pair=pair, status="ok", step_time_s=t, optimizer_steps=20,
                                 tokens=0, invariants=checks, coarse=True, loss_from_log=True, unchecked=("work.tokens",),
                                 loss_curve=tuple(ev.LossPoint(p.step, p.loss * scale) for p in curve))  # fmt: skip

    runs = [run(f"{arm}{i}", arm, i, t, s) for i in range(3) for arm, t, s in (("baseline", 1.0, 1.0), ("candidate", 0.8, 1.001))]
    done = vf.decide(_round(runs), passes_before=0, passes_required=1, loss_rule=RULE)
    assert "loss" in {i.name for i in done.invariants} and "loss" not in done.unchecked_invariants
    assert done.promotable
    runs = [run(f"{arm}{i}", arm, i, t, s) for i in range(3) for arm, t, s in (("baseline", 1.0, 1.0), ("candidate", 0.8, 1.1))]
    bad = vf.decide(_round(runs), passes_before=0, passes_required=1, loss_rule=RULE)
    assert bad.failed_invariants == ["loss"] and not bad.promotable


def test_a_printed_time_mismatch_under_cpu_pressure_is_a_rerun_not_a_verdict() -> None:
    base = coarse(logged(steps=31, losses=[4.0] * 31), kind="baseline")
    loaded = msgspec.structs.replace(logged(steps=31, losses=[4.0] * 31, printed_s=0.3), cpu_pressure=0.6)
    m = coarse(loaded, baseline=base)
    assert m.interfered and m.status == "invariant_violation"
    assert "measured under interference" in {i.name: i for i in m.invariants}["timing"].detail
    assert not coarse(logged(steps=31, losses=[4.0] * 31, printed_s=0.3), baseline=base).interfered


# --------------------------------------------------------------------------------------------------
# Tokens and evals of a coarse job: printed, or stated by the contract, and held to the golden baseline's
# --------------------------------------------------------------------------------------------------


def worked(f: ev.TrialFinished, stated: stats.StatedWork, *, baseline: ev.TrialMeasured | None = None,
           kind: ev.TrialKind = "search") -> ev.TrialMeasured:  # fmt: skip
    return stats.measure_coarse(f, candidate_key="k", kind=kind, horizon=10, spec=SPEC, counts_steps=True,
                                is_baseline=kind == "baseline", baseline=baseline, stated=stated)  # fmt: skip


def tokens_of(m: ev.TrialMeasured) -> ev.InvariantResult:
    return {i.name: i for i in m.invariants}["work.tokens"]


def test_printed_tokens_are_held_to_the_golden_baselines() -> None:
    run = logged(steps=10, losses=[4.0] * 10)
    base = worked(msgspec.structs.replace(run, output_tokens=5120), stats.StatedWork(), kind="baseline")
    assert tokens_of(base).ok and base.tokens == 5120 and "read from the job's log" in tokens_of(base).detail
    same = worked(msgspec.structs.replace(run, output_tokens=5120), stats.StatedWork(), baseline=base)
    assert same.status == "ok" and "the golden baseline trained 5120" in tokens_of(same).detail
    # the same steps counted, but fewer tokens trained (a micro-batch dropped from each step): caught
    fewer = worked(msgspec.structs.replace(run, output_tokens=3840), stats.StatedWork(), baseline=base)
    assert fewer.status == "invariant_violation" and [i.name for i in fewer.invariants if not i.ok] == ["work.tokens"]


def test_printed_micro_batches_are_tokens_by_the_trials_micro_batch() -> None:
    run = logged(steps=10, losses=[4.0] * 10)
    # LitGPT: `iter 40 step 10` at micro-batch 2 (accumulation 4), `iter 10 step 10` at micro-batch 8
    base = worked(msgspec.structs.replace(run, output_micro_batches=40),
                  stats.StatedWork(tokens_per_step=512, tokens_per_micro_batch=2 * 64, micro_batch_how="micro-batch 2 × sequence 64"),
                  kind="baseline")  # fmt: skip
    assert base.tokens == 5120 and "40 micro-batches read from the job's log × 128 tokens (micro-batch 2 × sequence 64)" in tokens_of(base).detail
    larger = stats.StatedWork(tokens_per_step=512, tokens_per_micro_batch=8 * 64, micro_batch_how="micro-batch 8 × sequence 64")
    assert worked(msgspec.structs.replace(run, output_micro_batches=10), larger, baseline=base).status == "ok"
    # a step that ran fewer micro-batches than its global batch needs: the steps counted agree, the tokens do not
    short = worked(msgspec.structs.replace(run, output_micro_batches=9), larger, baseline=base)
    assert [i.name for i in short.invariants if not i.ok] == ["work.tokens"], short.invariants


def test_without_a_printed_count_the_tokens_are_derived_from_what_the_contract_states() -> None:
    stated = stats.StatedWork(tokens_per_step=8 * 16, how="global batch 8 × sequence 16")
    base = worked(logged(steps=10, losses=[4.0] * 10), stated, kind="baseline")
    assert base.tokens == 1280 and tokens_of(base).detail.startswith("1280 tokens, derived: 10 steps counted × 128")
    assert worked(logged(steps=10, losses=[4.0] * 10), stated, baseline=base).status == "ok"
    # before any golden baseline at this horizon: the horizon × the stated tokens per step
    alone = worked(logged(steps=10, losses=[4.0] * 10), stated)
    assert tokens_of(alone).ok and "horizon 10 × 128" in tokens_of(alone).detail
    # nothing printed and nothing stated: unchecked, saying what to give
    bare = worked(logged(steps=10, losses=[4.0] * 10), stats.StatedWork(), baseline=base)
    reason = {u.name: u.reason for u in bare.unchecked_invariants}["work.tokens"]
    assert "workload.measurement.tokens_regex" in reason and "workload.shape.seq_len" in reason, reason


def test_printed_evals_are_held_to_the_golden_baselines() -> None:
    base = worked(logged(steps=10, losses=[4.0] * 10, eval_every=5), stats.StatedWork(), kind="baseline")
    evals = {i.name: i for i in base.invariants}["work.eval"]
    assert evals.ok and "evals after steps [1, 6] read from the job's log" in evals.detail, evals
    assert worked(logged(steps=10, losses=[4.0] * 10, eval_every=5), stats.StatedWork(), baseline=base).status == "ok"
    fewer = worked(logged(steps=10, losses=[4.0] * 10, eval_every=10), stats.StatedWork(), baseline=base)
    assert "work.eval" in [i.name for i in fewer.invariants if not i.ok]  # (and the eval loss it lacks)
    # a job that prints no eval: unchecked, by name
    assert "work.eval" in {u.name for u in worked(logged(steps=10, losses=[4.0] * 10), stats.StatedWork()).unchecked_invariants}


def test_a_coarse_verify_round_compares_the_tokens_and_evals_both_runs_gave() -> None:
    scope = ev.InvariantResult(name="scope", ok=True, detail="in scope")
    counted_work = (scope, ev.InvariantResult(name="work.tokens", ok=True, detail="t"),
                    ev.InvariantResult(name="work.eval", ok=True, detail="e"))  # fmt: skip
    evals = (ev.LossPoint(10, 5.0), ev.LossPoint(20, 4.0))

    def run(trial_id: str, arm: vf.Arm, pair: int, t: float, tokens: int, eval_curve: tuple[ev.LossPoint, ...] = evals
            ) -> vf.RunMeasurement:  # fmt: skip
        return vf.RunMeasurement(trial_id=trial_id, arm=arm, pair=pair, status="ok", step_time_s=t, optimizer_steps=20,
                                 tokens=tokens, invariants=counted_work, coarse=True, unchecked=("loss", "timing"),
                                 eval_curve=eval_curve)  # fmt: skip

    runs = [run(f"{a}{i}", a, i, t, 2560) for i in range(3) for a, t in (("baseline", 1.0), ("candidate", 0.8))]
    done = vf.decide(_round(runs), passes_before=0, passes_required=1, loss_rule=RULE)
    assert {"work.tokens", "work.eval"} <= {i.name for i in done.invariants} and done.promotable, done
    assert not {"work.tokens", "work.eval"} & set(done.unchecked_invariants)
    runs[1] = run("candidate0", "candidate", 0, 0.8, 1280)
    assert vf.decide(_round(runs), passes_before=0, passes_required=1, loss_rule=RULE).failed_invariants == ["work.tokens"]
    runs[1] = run("candidate0", "candidate", 0, 0.8, 2560, evals[:1])
    assert vf.decide(_round(runs), passes_before=0, passes_required=1, loss_rule=RULE).failed_invariants == ["work.eval"]


def test_a_coarse_pair_under_loss_at_every_eval_is_compared_on_its_printed_eval_loss() -> None:
    # LitGPT at another micro-batch: litdata deals the samples in another order, so the per-step train loss is of
    # other batches (10 % apart), while the validation loss it prints stays within ε
    base_train = tuple(ev.LossPoint(n, 4.0 - n / 20) for n in range(1, 61))
    reordered = tuple(ev.LossPoint(p.step, p.loss * (1.1 if p.step % 2 else 0.9)) for p in base_train)
    evals = tuple(ev.LossPoint(n, 6.0 + n / 100) for n in range(10, 61, 10))

    def run(trial_id: str, arm: vf.Arm, pair: int, t: float, train: tuple[ev.LossPoint, ...], scale: float
            ) -> vf.RunMeasurement:  # fmt: skip
        return vf.RunMeasurement(trial_id=trial_id, arm=arm, pair=pair, status="ok", step_time_s=t, optimizer_steps=60,
                                 tokens=0, invariants=(ev.InvariantResult(name="scope", ok=True, detail="in scope"),),
                                 coarse=True, loss_from_log=True, unchecked=("work.tokens", "work.eval"), loss_curve=train,
                                 eval_curve=tuple(ev.LossPoint(p.step, p.loss * scale) for p in evals))  # fmt: skip

    def rounds(scale: float) -> vf.Round:
        return _round([run(f"{a}{i}", a, i, t, c, s) for i in range(3)
                       for a, t, c, s in (("baseline", 1.0, base_train, 1.0), ("candidate", 0.8, reordered, scale))])  # fmt: skip

    at_eval = vf.LossRule(tolerance=0.05, mode="relative", eval_only_when_coarse=True)
    done = vf.decide(rounds(1.01), passes_before=0, passes_required=1, loss_rule=at_eval)
    assert done.promotable and {"loss", "loss.trend"} <= {i.name for i in done.invariants}, done.invariants
    assert "eval loss" in {i.name: i for i in done.invariants}["loss"].detail
    # a candidate whose held-out loss is off is still rejected; every step's train loss is what every_step compares
    assert vf.decide(rounds(1.08), passes_before=0, passes_required=1, loss_rule=at_eval).failed_invariants == ["loss"]
    every_step = vf.LossRule(tolerance=0.05, mode="relative")
    assert "loss" in vf.decide(rounds(1.01), passes_before=0, passes_required=1, loss_rule=every_step).failed_invariants
