"""The probe counts tokens, loss tokens and optimiser steps itself, times steps with eval paused, measures
FLOPs, writes one decodable TrialStep envelope per step as the step ends, and never lets NATS trouble
reach training."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from infrarsi import events
from infrarsi.bus import subjects
from infrarsi.probe import Probe, read_records
from torch import nn


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 16, dim: int = 8) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.emb(idx))  # (B, T, V)
        return nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-100)


@pytest.fixture
def probe(tmp_path: Path) -> Probe:
    p = Probe(out_dir=tmp_path, study_id="s1", trial_id="t1", peak_flops=1e9)
    yield p
    p.close()


def train_steps(probe: Probe, steps: int, *, skip_every: int = 0, accum: int = 2, B: int = 3, T: int = 5) -> None:
    torch.manual_seed(0)
    model = TinyLM()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    probe.attach(model=model, optimizer=opt)
    for step in range(steps):
        with probe.step() as s:
            total = torch.zeros(())
            for _ in range(accum):
                x = torch.randint(0, 16, (B, T))
                y = torch.randint(0, 16, (B, T))
                y[:, 0] = -100  # one ignored target per sequence
                with s.phase("forward"):
                    loss = model(x, y)
                with s.phase("backward"):
                    (loss / accum).backward()
                total += loss.detach() / accum
            s.loss(total)
            with s.phase("optimizer"):
                if not (skip_every and step % skip_every == 0):
                    opt.step()
                opt.zero_grad()
            if step == steps - 1:
                with s.evaluation() as ev:
                    ev.loss(model(torch.zeros(2, T, dtype=torch.long), torch.zeros(2, T, dtype=torch.long)))


def test_counts_tokens_loss_tokens_and_optimizer_steps(probe: Probe) -> None:
    train_steps(probe, 4, skip_every=2)
    recs = read_records(probe.path)
    assert [r.step for r in recs] == [0, 1, 2, 3]
    assert {r.tokens for r in recs} == {2 * 3 * 5}
    assert {r.loss_tokens for r in recs} == {2 * 3 * 4}
    assert [r.optimizer_steps for r in recs] == [0, 1, 1, 2]  # steps 0 and 2 skipped: the hook saw it
    assert recs[-1].eval_tokens == 10 and recs[-1].eval_loss is not None
    assert all(r.eval_loss is None for r in recs[:-1])
    assert {"forward", "backward", "optimizer"} <= recs[0].phases.keys()
    assert "eval" in recs[-1].phases
    assert all(r.peak_memory_bytes > 0 and r.world_size == 1 and r.rank == 0 for r in recs)


def test_each_step_is_on_disk_when_the_step_ends(probe: Probe) -> None:
    model = TinyLM()
    probe.attach(model=model)
    for n in range(3):
        with probe.step() as s:
            s.loss(1.0)
        assert probe.path.read_bytes().count(b"\n") == n + 1  # no close/flush needed


def test_envelope_is_a_trial_step_event_with_deterministic_ids(probe: Probe) -> None:
    with probe.step() as s:
        s.loss(2.5)
    line = probe.path.read_bytes().splitlines()[0]
    event = events.decode(line)
    assert event.type == "TrialStep" and event.study_id == "s1" and event.trial_id == "t1"
    assert event.source == "probe"
    assert event.event_id == events.derived_id("t1", "0", "step", "0")
    assert subjects.subject_for(event) == probe.subject == "irsi.telemetry.s1.t1"
    assert probe.msg_id(0) == "t1:0:step:0"
    assert event.payload.loss == 2.5


def test_a_failed_step_writes_nothing(probe: Probe) -> None:
    with pytest.raises(RuntimeError), probe.step():
        raise RuntimeError("boom")
    assert read_records(probe.path) == []


def test_eval_time_is_not_step_time(probe: Probe) -> None:
    import time

    with probe.step() as s:
        time.sleep(0.02)
        with s.evaluation():
            time.sleep(0.2)
    rec = probe.records[-1]
    assert 0.02 <= rec.step_time_s < 0.15
    assert rec.phases["eval"] >= 0.2


def test_flop_count_and_mfu(probe: Probe) -> None:
    lin = nn.Linear(32, 64, bias=False)
    x = torch.randn(10, 32, requires_grad=True)
    with probe.count_flops(multiplier=3):
        lin(x).sum().backward()
    fwd = 2 * 10 * 32 * 64
    assert probe.flops_per_step == pytest.approx(3 * fwd * 3)  # fwd + 2× in backward (input and weight grads), × 3 micro-batches
    with probe.step() as s:
        s.loss(0.0)
    rec = probe.records[-1]
    assert rec.flops == probe.flops_per_step
    assert rec.mfu == pytest.approx(rec.flops / (rec.step_time_s * 1e9))


def test_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFRARSI_PROBE_DIR", str(tmp_path / "d"))
    monkeypatch.setenv("INFRARSI_STUDY", "st")
    monkeypatch.setenv("INFRARSI_TRIAL", "tr")
    monkeypatch.setenv("INFRARSI_PEAK_FLOPS", "2e12")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.delenv("INFRARSI_NATS_URL", raising=False)
    with Probe.from_env() as p:
        assert p.path == tmp_path / "d" / "probe-rank3.jsonl"
        assert (p.study_id, p.trial_id, p.rank, p.world_size, p.peak_flops) == ("st", "tr", 3, 4, 2e12)
        assert p._nats is None


def test_unreachable_nats_never_reaches_training(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="infrarsi.probe")
    p = Probe(out_dir=tmp_path, trial_id="t", nats_url="nats://127.0.0.1:1")
    for _ in range(3):
        with p.step() as s:
            s.loss(1.0)
    p.close()
    assert len(read_records(p.path)) == 3
    assert any("cannot connect to NATS" in r.getMessage() for r in caplog.records)


def test_a_step_without_a_loss_is_written_and_read_back(probe: Probe) -> None:
    """A Trainer that logs every k steps leaves steps without a loss: they are records with ``loss=None``
    (a NaN was written as JSON null and the whole record failed to decode)."""
    with probe.step():
        pass
    (rec,) = read_records(probe.path)
    assert rec.step == 0 and rec.loss is None
