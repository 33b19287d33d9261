"""The probe integrations' contract: every integration reports the same facts of a real training run.

One suite, parametrised over the integrations (as Optuna runs one storage suite over every storage):
plain PyTorch (``track`` + decorators), Hugging Face ``Trainer`` (``TrainerCallback``) and Lightning
(``Callback``), each training a tiny GPT-2 built from a config on synthetic data (nothing downloaded). The
facts are the ones telemetry checks (services/telemetry → ``infrarsi.verdicts.stats``): one record per optimiser
step, optimiser steps counted by the optimiser's hook, tokens per step = global batch × sequence length
whatever the accumulation, the step's loss and the eval that follows it as the framework itself reports
them, FLOPs counted once, peak memory, and step times that the phases add up to. The records are also
put through ``stats.measure`` as telemetry would, so "the integration's facts pass the invariants" and
"a skipped optimiser step is caught by name" are tested on the real thing.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from pathlib import Path

import pytest
from infrarsi import events
from infrarsi.probe import Probe, read_records
from infrarsi.verdicts import stats
from support.framework_jobs import SEQ_LEN, FrameworkFacts, JobConfig, run_hf, run_lightning, run_torch

Runner = Callable[[Probe | None, JobConfig, Path], FrameworkFacts]


def _torch(probe: Probe | None, cfg: JobConfig, workdir: Path) -> FrameworkFacts:
    from infrarsi.probe.integrations.torch import track

    return run_torch(lambda model, opt: track(model, opt, probe=probe), cfg, workdir)


def _hf(probe: Probe | None, cfg: JobConfig, workdir: Path) -> FrameworkFacts:
    from infrarsi.probe.integrations.hf import InfraRSICallback

    return run_hf(InfraRSICallback(probe), cfg, workdir)


def _lightning(probe: Probe | None, cfg: JobConfig, workdir: Path) -> FrameworkFacts:
    from infrarsi.probe.integrations.lightning import InfraRSICallback

    return run_lightning(InfraRSICallback(probe), cfg, workdir)


INTEGRATIONS: dict[str, Runner] = {"torch": _torch, "hf": _hf, "lightning": _lightning}

BASE = JobConfig()
UNACCUMULATED = JobConfig(micro_batch=BASE.global_batch, accum=1)
HACKED = JobConfig(skip_optimizer_every=2)


@pytest.fixture(params=sorted(INTEGRATIONS))
def integration(request: pytest.FixtureRequest) -> str:
    return request.param


_runs: dict[tuple[str, JobConfig], tuple[list[events.TrialStep], FrameworkFacts]] = {}


@pytest.fixture
def run(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, JobConfig], tuple[list[events.TrialStep], FrameworkFacts]]:
    """(integration, config) → (the probe's records as written to disk, the framework's facts); each
    configuration trains once per session."""

    def go(name: str, cfg: JobConfig) -> tuple[list[events.TrialStep], FrameworkFacts]:
        key = (name, cfg)
        if key not in _runs:
            workdir = tmp_path_factory.mktemp(name)
            probe = Probe(out_dir=workdir / "probe", study_id="s", trial_id=f"{name}-{id(cfg)}", peak_flops=1e11)
            try:
                facts = INTEGRATIONS[name](probe, cfg, workdir)
            finally:
                probe.close()
            _runs[key] = (read_records(probe.path), facts)
        return _runs[key]

    return go


def _measure(records: list[events.TrialStep], cfg: JobConfig, baseline: stats.Series | None) -> events.TrialMeasured:
    spec = stats.InvariantSpec(loss_tolerance=0.02, loss_at="every_eval", global_batch=cfg.global_batch)
    finished = events.TrialFinished(status="ok", steps_completed=len(records), ranks=1)
    measured, _ = stats.measure(
        records, finished, candidate_key="c", kind="search" if baseline else "baseline", horizon=cfg.steps,
        spec=spec, baseline=baseline, peak_flops_per_device=1e11,
    )  # fmt: skip
    return measured


def test_one_record_per_optimizer_step_with_the_global_batch_of_tokens(integration: str, run) -> None:
    records, _ = run(integration, BASE)
    assert [r.step for r in records] == list(range(BASE.steps))
    assert [r.optimizer_steps for r in records] == list(range(1, BASE.steps + 1))
    assert {r.tokens for r in records} == {BASE.global_batch * SEQ_LEN}  # every micro-batch of the step
    assert {r.loss_tokens for r in records} == {BASE.global_batch * SEQ_LEN}  # no label is ignored here
    assert all(r.rank == 0 and r.world_size == 1 for r in records)


def test_the_loss_is_the_one_the_framework_reports(integration: str, run) -> None:
    records, facts = run(integration, BASE)
    assert sorted(facts.train_loss) == list(range(BASE.steps))
    for r in records:
        assert r.loss == pytest.approx(facts.train_loss[r.step], rel=1e-4), r.step
    assert records[-1].loss < records[0].loss  # the data is learnable: a real run, not a constant


def test_the_evaluation_belongs_to_the_step_it_followed(integration: str, run) -> None:
    records, facts = run(integration, BASE)
    evaluated = [r.step for r in records if r.eval_loss is not None]
    assert evaluated == sorted(facts.eval_loss) == [2, 5]
    for r in records:
        if r.eval_loss is not None:
            assert r.eval_loss == pytest.approx(facts.eval_loss[r.step], rel=1e-4)
            assert r.eval_tokens == BASE.eval_sequences * SEQ_LEN
        else:
            assert r.eval_tokens is None


def test_flops_are_counted_once_and_memory_and_time_are_measured(integration: str, run) -> None:
    records, facts = run(integration, BASE)
    flops = {r.flops for r in records}
    assert len(flops) == 1
    (per_step,) = flops
    approx = 6 * facts.parameters * BASE.global_batch * SEQ_LEN  # the 6·N·D rule of thumb
    assert 0.5 * approx < per_step < 2.0 * approx
    assert all(r.mfu is not None and 0 < r.mfu < 1 for r in records)
    assert all(r.peak_memory_bytes > 0 for r in records)
    for r in records:
        assert r.step_time_s > 0
        phases = r.phases["data"] + r.phases["forward_backward"] + r.phases["optimizer"]
        assert phases == pytest.approx(r.step_time_s, rel=0.05, abs=2e-3)  # the phases tile the step
        assert r.phases["forward_backward"] > r.phases["data"]


def test_the_records_pass_telemetrys_invariants(integration: str, run) -> None:
    records, _ = run(integration, BASE)
    measured = _measure(records, BASE, baseline=None)
    assert measured.status == "ok", [i for i in measured.invariants if not i.ok]
    names = {i.name for i in measured.invariants}
    assert {"work.optimizer_steps", "work.tokens", "work.eval"} <= names
    assert measured.tokens_per_s > 0 and measured.mfu and measured.peak_memory_bytes[0] > 0


def test_accumulation_is_counted_as_one_step_of_the_same_work(integration: str, run) -> None:
    """micro-batch 8 × 1 against 4 × 2: the same optimiser steps, tokens, eval and loss curve (within 2%),
    so a legitimate accumulation change passes every invariant against the other as baseline."""
    accumulated, _ = run(integration, BASE)
    single, _ = run(integration, UNACCUMULATED)
    assert [r.tokens for r in single] == [r.tokens for r in accumulated]
    baseline = stats.summarise(single)
    measured = _measure(accumulated, BASE, baseline=baseline)
    assert measured.status == "ok", [i for i in measured.invariants if not i.ok]
    loss = next(i for i in measured.invariants if i.name == "loss")
    assert not loss.detail.startswith("not checked")


def test_a_skipped_optimizer_step_is_caught_by_name(integration: str, run) -> None:
    records, _ = run(integration, HACKED)
    assert len(records) == HACKED.steps  # the job still claims every step
    assert records[-1].optimizer_steps == HACKED.steps // 2  # the optimiser's own hook saw half
    measured = _measure(records, HACKED, baseline=None)
    failed = [i.name for i in measured.invariants if not i.ok]
    assert measured.status == "invariant_violation" and failed == ["work.optimizer_steps"]


def test_outside_infrarsi_the_integration_does_nothing(
    integration: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("INFRARSI_TRIAL", "INFRARSI_PROBE_DIR", "INFRARSI_NATS_URL", "INFRARSI_STUDY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    cfg = JobConfig(steps=2, eval_every=2)
    facts = INTEGRATIONS[integration](None, cfg, tmp_path)
    assert len(facts.train_loss) == 2 and all(math.isfinite(v) for v in facts.train_loss.values())
    assert not list(tmp_path.rglob("probe-rank*.jsonl")) and not (Path(os.getcwd()) / ".infrarsi").exists()


def test_the_model_shape_is_read_when_the_probe_attaches(integration: str, run) -> None:
    records, facts = run(integration, BASE)
    shape = records[0].shape
    assert shape is not None and all(r.shape is None for r in records[1:])  # sent once
    assert shape.parameters == facts.parameters and shape.expert_parameters == 0
    assert (shape.layers, shape.hidden, shape.heads, shape.vocab, shape.experts) == (2, 64, 2, 64, None)
    assert shape.seq_len == SEQ_LEN and shape.sources["seq_len"] == "inputs"  # as fed, not the config's context
    assert shape.sources["layers"] == "config"
