"""Tiny real training jobs, one per probe integration, for the integrations' contract suite.

Every job trains the same tiny GPT-2 (built from a config, nothing downloaded) on the same synthetic,
learnable sequences, with the same knobs (micro-batch, accumulation, steps, eval interval), written the
way its framework's users write it, with the integration's one line. Each returns what the framework
itself (or the loop) says about the run — its own per-step train loss and eval loss — so the suite can
hold the probe's records against the framework's numbers.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

VOCAB = 64
SEQ_LEN = 32
TINY_GPT2 = {"vocab_size": VOCAB, "n_positions": SEQ_LEN, "n_embd": 64, "n_layer": 2, "n_head": 2}


@dataclass(frozen=True)
class JobConfig:
    steps: int = 6
    micro_batch: int = 4
    accum: int = 2
    eval_every: int = 3
    eval_sequences: int = 8
    lr: float = 1e-3
    skip_optimizer_every: int = 0
    """A reward hack: every k-th optimiser step is skipped (0: never)."""

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.accum


@dataclass
class FrameworkFacts:
    """The framework's own account of the run (step index → value, 0-based like the probe's)."""

    train_loss: dict[int, float] = field(default_factory=dict)
    eval_loss: dict[int, float] = field(default_factory=dict)
    parameters: int = 0


class SyntheticLM(torch.utils.data.Dataset):
    """Learnable sequences: each token is the previous one plus a per-sequence stride, mod VOCAB."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, VOCAB, (n, 1), generator=g)
        stride = torch.randint(1, 4, (n, 1), generator=g)
        self.ids = (start + stride * torch.arange(SEQ_LEN)) % VOCAB  # (n, T)

    def __len__(self) -> int:
        return self.ids.shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def tiny_gpt2() -> torch.nn.Module:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(**TINY_GPT2))


def _datasets(cfg: JobConfig) -> tuple[SyntheticLM, SyntheticLM]:
    return SyntheticLM(cfg.steps * cfg.global_batch, seed=1), SyntheticLM(cfg.eval_sequences, seed=2)


class SkipEvery(torch.optim.AdamW):
    """The reward hack: an optimiser whose ``step`` leaves the parameters alone every k-th call."""

    def __init__(self, params: object, every: int, **kwargs: object) -> None:
        super().__init__(params, **kwargs)  # type: ignore[arg-type]
        self.every, self.calls = every, 0

    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        self.calls += 1
        if self.calls % self.every == 0:  # the gradients are computed (Lightning's closure runs), never applied
            with torch.enable_grad():
                return closure() if closure is not None else None
        return super().step(closure)


def _optimizer(model: torch.nn.Module, cfg: JobConfig) -> torch.optim.Optimizer:
    if cfg.skip_optimizer_every:
        return SkipEvery(model.parameters(), cfg.skip_optimizer_every, lr=cfg.lr)
    return torch.optim.AdamW(model.parameters(), lr=cfg.lr)


def run_hf(callback: object, cfg: JobConfig, workdir: Path) -> FrameworkFacts:
    from transformers import Trainer, TrainingArguments

    model = tiny_gpt2()
    train, evaluation = _datasets(cfg)
    args = TrainingArguments(
        output_dir=str(workdir / "hf"),
        per_device_train_batch_size=cfg.micro_batch,
        gradient_accumulation_steps=cfg.accum,
        per_device_eval_batch_size=4,
        max_steps=cfg.steps,
        learning_rate=cfg.lr,
        lr_scheduler_type="constant",
        logging_steps=1,
        eval_strategy="steps",
        eval_steps=cfg.eval_every,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        disable_tqdm=True,
    )
    optimizers = (_optimizer(model, cfg), None) if cfg.skip_optimizer_every else (None, None)
    trainer = Trainer(
        model=model, args=args, train_dataset=train, eval_dataset=evaluation, callbacks=[callback],
        optimizers=optimizers,
    )  # fmt: skip
    trainer.train()
    log = trainer.state.log_history
    return FrameworkFacts(
        train_loss={e["step"] - 1: e["loss"] for e in log if "loss" in e},
        eval_loss={e["step"] - 1: e["eval_loss"] for e in log if "eval_loss" in e},
        parameters=sum(p.numel() for p in model.parameters()),
    )


def run_lightning(callback: object, cfg: JobConfig, workdir: Path) -> FrameworkFacts:
    import lightning.pytorch as pl

    facts = FrameworkFacts()
    micro_losses: list[float] = []

    class LitLM(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = tiny_gpt2()
            self.val_losses: list[float] = []

        def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
            loss = self.model(**batch).loss
            micro_losses.append(loss.item())
            if len(micro_losses) % cfg.accum == 0:
                facts.train_loss[len(micro_losses) // cfg.accum - 1] = sum(micro_losses[-cfg.accum :]) / cfg.accum
            return loss

        def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
            loss = self.model(**batch).loss
            self.val_losses.append(loss.item())
            self.log("val_loss", loss)

        def on_validation_epoch_end(self) -> None:
            if not self.trainer.sanity_checking:
                facts.eval_loss[self.trainer.global_step - 1] = sum(self.val_losses) / len(self.val_losses)
            self.val_losses.clear()

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return _optimizer(self.model, cfg)

    train, evaluation = _datasets(cfg)
    module = LitLM()
    trainer = pl.Trainer(
        max_steps=cfg.steps,
        accumulate_grad_batches=cfg.accum,
        val_check_interval=cfg.eval_every * cfg.accum,  # counted in training batches
        check_val_every_n_epoch=None,
        num_sanity_val_steps=0,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(workdir / "lightning"),
        callbacks=[callback],
    )
    loader = torch.utils.data.DataLoader(train, batch_size=cfg.micro_batch, shuffle=False)
    trainer.fit(module, loader, torch.utils.data.DataLoader(evaluation, batch_size=4))
    facts.parameters = sum(p.numel() for p in module.model.parameters())
    return facts


def run_torch(tracked_factory: Callable[..., object], cfg: JobConfig, workdir: Path) -> FrameworkFacts:
    """A plain loop, written before InfraRSI existed, plus ``track`` and two decorators."""
    model = tiny_gpt2()
    optimizer = _optimizer(model, cfg)
    train, evaluation = _datasets(cfg)
    loader = torch.utils.data.DataLoader(train, batch_size=cfg.global_batch, shuffle=False)
    facts = FrameworkFacts(parameters=sum(p.numel() for p in model.parameters()))
    tracked = tracked_factory(model, optimizer)

    @tracked.step
    def train_step(batch: dict[str, torch.Tensor]) -> torch.Tensor:
        total = torch.zeros(())
        for micro in range(cfg.accum):
            part = {k: v[micro * cfg.micro_batch : (micro + 1) * cfg.micro_batch] for k, v in batch.items()}
            loss = model(**part).loss
            (loss / cfg.accum).backward()
            total += loss.detach() / cfg.accum
        optimizer.step()
        optimizer.zero_grad()
        return total

    @tracked.evaluation
    def evaluate() -> float:
        with torch.no_grad():
            losses = [float(model(**evaluation[i : i + 4]).loss) for i in range(0, len(evaluation), 4)]
        return sum(losses) / len(losses)

    with tracked:
        for step, batch in enumerate(loader):
            facts.train_loss[step] = float(train_step(batch))
            if (step + 1) % cfg.eval_every == 0:
                facts.eval_loss[step] = evaluate()
    return facts
