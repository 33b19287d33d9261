"""Train the reference GPT (dense or MoE) from a launch file, reporting every optimiser step to the probe.

    python train.py --launch-file launch/dense-1node.yaml [--set knobs.micro_batch_size=8 ...]
    python -m torch.distributed.run --nproc-per-node 2 train.py --launch-file launch/dense-2node.yaml

One process per rank: gloo on CPU, NCCL on CUDA. Dense models are data-parallel (DDP or FSDP2); MoE
models are data-parallel for the shared weights and expert-parallel for the experts (all_to_all).
The job exits non-zero on any failure and lets ``torch.OutOfMemoryError`` propagate unchanged (the
launcher recognises OOM from the traceback and the exit status).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from checkpoint import load_checkpoint, save_checkpoint, save_final_weights
from config import LaunchConfig, load_launch, parse_override
from data import FLOP_SAMPLE_OFFSET, MarkovCorpus, StepBatches, eval_sequences
from infrarsi.probe import Probe
from infrarsi.probe.checkpointing import CheckpointRequest
from model import GPT, ExpertParallel
from torch.nn.parallel import DistributedDataParallel as DDP


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--launch-file", type=Path, default=None, help="YAML launch file (defaults when omitted)")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="dotted launch key override, value parsed as YAML, e.g. knobs.micro_batch_size=8",
    )  # fmt: skip
    parser.add_argument(
        "--probe-dir", type=Path, default=None,
        help="where the probe writes probe-rank{r}.jsonl (default: $INFRARSI_PROBE_DIR, else ./.infrarsi/probe)",
    )  # fmt: skip
    return parser.parse_args(argv)


def setup_distributed(cfg: LaunchConfig) -> tuple[int, int, torch.device]:
    """Start the process group (a one-rank group when not launched by torchrun) and pick the device."""
    on_cuda = cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available())
    backend = "nccl" if on_cuda else "gloo"
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        device = torch.device("cuda", local_rank) if on_cuda else torch.device("cpu")
        if on_cuda:
            torch.cuda.set_device(device)
        dist.init_process_group(backend, device_id=device if on_cuda else None)
    else:
        device = torch.device("cuda", 0) if on_cuda else torch.device("cpu")
        if on_cuda:
            torch.cuda.set_device(device)
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    return dist.get_rank(), dist.get_world_size(), device


def lr_at(cfg: LaunchConfig, step: int) -> float:
    """Linear warm-up, then cosine decay to ``lr × min_lr_ratio`` at the last step."""
    run = cfg.run
    if step < run.warmup_steps:
        return run.lr * (step + 1) / run.warmup_steps
    progress = (step - run.warmup_steps) / max(1, run.steps - run.warmup_steps)
    return run.lr * (run.min_lr_ratio + (1 - run.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def build_optimizer(cfg: LaunchConfig, model: torch.nn.Module) -> torch.optim.AdamW:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    impl = cfg.knobs.optimizer_impl
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.run.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.run.lr,
        betas=cfg.run.betas,
        foreach=impl == "foreach",
        fused=True if impl == "fused" else None,
    )


def clip_grad_norm(params: list[torch.nn.Parameter], sharded: set[int], max_norm: float) -> torch.Tensor:
    """Global-norm clip where some gradients are sharded over ranks (FSDP2 DTensors, EP experts)."""
    local_sq = torch.zeros((), dtype=torch.float32)
    sharded_sq = torch.zeros((), dtype=torch.float32)
    any_sharded = False
    for p in params:
        if p.grad is None:
            continue
        is_dtensor = hasattr(p.grad, "to_local")
        grad = p.grad.to_local() if is_dtensor else p.grad
        sq = grad.detach().float().pow(2).sum().cpu()
        if id(p) in sharded or is_dtensor:
            sharded_sq += sq
            any_sharded = True
        else:
            local_sq += sq
    if dist.get_world_size() > 1 and any_sharded:
        if dist.get_backend() == "nccl":
            sharded_sq = sharded_sq.cuda()
        dist.all_reduce(sharded_sq)
    total = (local_sq + sharded_sq.cpu()).sqrt()
    scale = min(1.0, max_norm / (float(total) + 1e-6))
    if scale < 1.0:
        for p in params:
            if p.grad is not None:
                p.grad.mul_(scale)
    return total


def wrap_model(cfg: LaunchConfig, model: GPT, world: int, device: torch.device) -> torch.nn.Module:
    """Compile blocks, then wrap for data parallelism as the ``sharding`` knob says."""
    knobs = cfg.knobs
    if knobs.compile:
        for block in model.blocks:
            block.compile(mode=knobs.compile_mode)  # per block: the probe's hook on GPT.forward stays eager
    if knobs.sharding in ("fsdp2", "fsdp2_no_reshard"):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(device.type, (world,))
        reshard = knobs.sharding == "fsdp2"
        for block in model.blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
        return model
    if knobs.sharding == "fsdp1":
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        return FSDP(model, device_id=device)
    if world == 1:
        return model  # DDP over one rank only adds copies
    if cfg.model.kind == "moe":
        expert_ids = {id(p) for p in model.expert_parameters()}
        ignored = [name for name, p in model.named_parameters() if id(p) in expert_ids]
        DDP._set_params_and_buffers_to_ignore_for_model(model, ignored)
    return DDP(
        model,
        device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=knobs.ddp_bucket_cap_mb,
        gradient_as_bucket_view=knobs.gradient_as_bucket_view,
    )


@contextlib.contextmanager
def no_grad_sync(model: torch.nn.Module, last: bool) -> Iterator[None]:
    """Skip DDP's all-reduce on all but the last micro-batch of an optimiser step."""
    if isinstance(model, DDP) and not last:
        with model.no_sync():
            yield
    else:
        yield


def evaluate(
    cfg: LaunchConfig, model: torch.nn.Module, batch: torch.Tensor, device: torch.device, amp: contextlib.AbstractContextManager
) -> torch.Tensor:
    """Mean cross-entropy of this rank's eval sequences, in micro-batch chunks (a per-sequence mean, so
    the chunking does not change it)."""
    total = torch.zeros((), device=device)
    with torch.no_grad():
        for chunk in batch.split(cfg.knobs.micro_batch_size):
            chunk = chunk.to(device)
            with amp:
                out = model(chunk[:, :-1], chunk[:, 1:])
            total += out.ce.float() * chunk.shape[0]
    return total / batch.shape[0]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = load_launch(args.launch_file, dict(parse_override(o) for o in args.overrides))
    torch.set_num_threads(cfg.knobs.intra_op_threads)
    rank, world, device = setup_distributed(cfg)
    cfg.check_world(world, device.type == "cuda")
    accum = cfg.accumulation_steps(world)
    knobs, run = cfg.knobs, cfg.run

    torch.manual_seed(run.seed)
    moe = cfg.model.kind == "moe"
    model = GPT(
        cfg.model,
        attention=knobs.attention,
        checkpointing=knobs.activation_checkpointing,
        capacity_factor=knobs.moe_capacity_factor,
        expert_impl=knobs.moe_expert_impl,
        ep=ExpertParallel(dist.group.WORLD, world, rank) if moe and world > 1 else ExpertParallel(),
    ).to(device)
    expert_params = set(map(id, model.expert_parameters())) if moe and world > 1 else set()
    amp_dtype = torch.bfloat16 if knobs.autocast_dtype == "bfloat16" else torch.float32
    amp = torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype != torch.float32)

    corpus = MarkovCorpus(run.seed, cfg.model.vocab_size, cfg.model.seq_len)
    eval_batch = eval_sequences(corpus, run.eval_batch_size, rank, world)
    probe = Probe.from_env(device=device, rank=rank, world_size=world, out_dir=args.probe_dir)

    # FLOPs of one micro-batch forward+backward, counted once on the bare model (before compile/wrap).
    sample = torch.from_numpy(corpus.sequences(FLOP_SAMPLE_OFFSET, knobs.micro_batch_size)).to(device)
    with probe.count_flops(multiplier=accum), amp:
        model(sample[:, :-1], sample[:, 1:]).loss.backward()
    model.zero_grad(set_to_none=True)

    probe.attach(model=model, optimizer=None)
    train_model = wrap_model(cfg, model, world, device)
    optimizer = build_optimizer(cfg, train_model)
    checkpoints = CheckpointRequest.from_env()  # verify's restart check and downstream evaluation
    first_step = 0
    if checkpoints.resume_from is not None:  # before the probe sees the optimiser: loading may step it once
        first_step = load_checkpoint(checkpoints.resume_from, train_model, optimizer)
    probe.attach(optimizer=optimizer)
    params = [p for p in train_model.parameters()]

    loader = torch.utils.data.DataLoader(
        StepBatches(corpus, run.global_batch_size, rank, world, knobs.micro_batch_size, run.steps, first_step),
        batch_size=None,
        shuffle=False,
        num_workers=knobs.dataloader_workers,
        prefetch_factor=2 if knobs.dataloader_workers else None,
    )
    batches = iter(loader)
    if rank == 0:
        n_params = sum(p.numel() for p in model.parameters())
        print(
            f"gpt {cfg.model.kind}: {n_params / 1e6:.2f}M params/rank, world={world}, accum={accum}, "
            f"device={device.type}, flops/step/rank={probe.flops_per_step:.3e}",
            flush=True,
        )

    for step in range(first_step, run.steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(cfg, step)
        with probe.step(step) as s:
            with s.phase("data"):
                micro_batches = next(batches)  # (accum, micro, T+1)
            loss_sum = torch.zeros((), device=device)
            for i in range(accum):
                mb = micro_batches[i].to(device, non_blocking=True)
                with no_grad_sync(train_model, last=i == accum - 1):
                    with s.phase("forward"), amp:
                        out = train_model(mb[:, :-1], mb[:, 1:])
                    with s.phase("backward"):
                        (out.loss / accum).backward()
                loss_sum += out.ce.detach().float()
            s.loss(loss_sum / accum)
            with s.phase("optimizer"):
                if expert_params:
                    for p in model.expert_parameters():  # sum over ranks' tokens → the DP mean
                        p.grad.div_(world)
                if run.grad_clip > 0:
                    clip_grad_norm(params, expert_params, run.grad_clip)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            if (step + 1) % run.eval_every == 0 or step == run.steps - 1:
                with s.evaluation() as ev:
                    ev.loss(evaluate(cfg, train_model, eval_batch, device, amp))
            if checkpoints.saves_after(step + 1):
                assert checkpoints.save_dir is not None  # saves_after says so
                with s.phase("checkpoint"):  # inside the step, so the launcher's clock and the steps agree
                    save_checkpoint(checkpoints.save_dir, train_model, optimizer, step + 1)
        if rank == 0:
            rec = probe.records[-1]
            evl = f" eval {rec.eval_loss:.4f}" if rec.eval_loss is not None else ""
            print(f"step {rec.step} loss {rec.loss:.6f} time {rec.step_time_s * 1e3:.1f}ms{evl}", flush=True)

    if checkpoints.final_weights_dir is not None:
        save_final_weights(checkpoints.final_weights_dir, train_model)
    probe.close()
    # Every rank reaches teardown together: gloo aborted one rank ("terminate called without an active
    # exception") when its peer was still in flight, and the peer then waited forever.
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
