"""The probe: what a training job calls to report its optimiser steps to InfraRSI.

Calling order (one process = one rank)::

    probe = Probe.from_env(device=device)          # rank/world from torch.distributed or RANK/WORLD_SIZE
    probe.attach(model=model, optimizer=opt)        # counts tokens (forward pre-hook) and optimiser steps
    with probe.count_flops(multiplier=accum):       # once: one micro-batch fwd+bwd under FlopCounterMode
        model(x, y).loss.backward()
    for step in range(steps):
        with probe.step() as s:                     # synchronised wall time of everything inside
            with s.phase("data"): ...
            with s.phase("forward"): ...
            s.loss(local_loss)                      # this rank's mean loss (tensor or float)
            if eval_due:
                with s.evaluation() as ev:          # the step's clock is paused while evaluating
                    ev.loss(local_eval_loss)
    probe.close()

What the probe counts itself, not taken from the job: tokens and loss tokens (from the model's inputs as
they enter ``forward``), optimiser steps (optimiser step hooks; where the optimiser counts its own
updates, as the Adam family does, a step counts only if that count moved, so an optimiser whose ``step``
returns early is not credited), FLOPs (``FlopCounterMode``), peak
memory (CUDA allocator peak, or the process's RSS high-water mark on CPU). Counts are summed over ranks
with one small all-reduce per step when a process group is up, so every rank's record holds global
tokens and the global mean loss; step times and peak memory stay per rank (stragglers).

Each step becomes one ``TrialStep`` event, written to ``$INFRARSI_PROBE_DIR/probe-rank{r}.jsonl`` and,
when ``INFRARSI_NATS_URL`` and ``INFRARSI_TRIAL`` are set, published on ``irsi.telemetry.<study>.<trial>``
with ``Nats-Msg-Id = <trial>:<rank>:step:<n>``. A Hugging Face ``TrainerCallback`` or a Lightning
``Callback`` maps onto this as ``on_step_begin → __enter__``, ``on_step_end → __exit__``.
This module must not import anything heavier than torch.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import resource
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import torch

from infrarsi import events
from infrarsi.bus.credentials import NKEY_FILE_ENV
from infrarsi.bus.subjects import step_msg_id, telemetry_subject
from infrarsi.probe.sinks import JsonlSink, NatsPublisher
from infrarsi.runtime.settings import JobEnv

log = logging.getLogger("infrarsi.probe")

IGNORE_INDEX = -100

TokenCounter = Callable[[tuple[Any, ...], dict[str, Any]], tuple[int, torch.Tensor | int | None]]
"""(forward args, kwargs) → (tokens entering the model, tokens that count in the loss)."""


def enable_determinism() -> None:
    """Torch's deterministic algorithms on, for ``invariants.parity: bitwise`` (``INFRARSI_DETERMINISTIC``).

    An op without a deterministic implementation then raises instead of running; the launcher also sets
    ``CUBLAS_WORKSPACE_CONFIG`` (cuBLAS reads it when it starts, which may be before the probe exists)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True


def model_inputs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The token ids among a forward's arguments: ``input_ids`` (or ``idx``), else the first argument."""
    return kwargs.get("input_ids", kwargs.get("idx", args[0] if args else None))


def count_tokens_default(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, torch.Tensor | int | None]:
    """First tensor argument (or ``input_ids``) = inputs; second (or ``targets``/``labels``) = targets."""
    inputs = model_inputs(args, kwargs)
    targets = kwargs.get("targets", kwargs.get("labels", args[1] if len(args) > 1 else None))
    tokens = inputs.numel() if isinstance(inputs, torch.Tensor) else 0
    loss_tokens = (targets != IGNORE_INDEX).sum() if isinstance(targets, torch.Tensor) else None
    return tokens, loss_tokens


def peak_memory_bytes(device: torch.device) -> int:
    """CUDA allocator peak since the last reset; on CPU the process's RSS high-water mark (never reset)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)  # Linux reports KiB, macOS bytes


def _state_step(optimizer: torch.optim.Optimizer, param: torch.Tensor) -> float | None:
    """The optimiser's own count of updates to ``param`` (Adam-family ``state["step"]``), if it keeps one."""
    step = optimizer.state.get(param, {}).get("step")
    return None if step is None else float(step)


def _watched_parameter(optimizer: torch.optim.Optimizer) -> tuple[torch.Tensor, float | None] | None:
    """A parameter the optimiser is about to update (the first with a gradient) and its update count now."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            if param.grad is not None:
                return param, _state_step(optimizer, param)
    return None


class _Clock:
    """Wall-clock markers: ``perf_counter`` on CPU; CUDA events on GPU (resolved after the step's sync)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def mark(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]  # unannotated __new__ in torch 2.13
            event.record()
            return event
        return time.perf_counter()

    def seconds(self, start: Any, end: Any) -> float:
        return float(start.elapsed_time(end)) / 1000.0 if self.cuda else float(end - start)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


class EvalContext:
    """One evaluation inside a step: the job reports its local mean eval loss; tokens are counted."""

    def __init__(self) -> None:
        self.tokens = 0
        self._loss: torch.Tensor | float | None = None

    def loss(self, value: torch.Tensor | float) -> None:
        self._loss = value.detach() if isinstance(value, torch.Tensor) else float(value)


class StepContext:
    """One optimiser step in progress (returned by ``Probe.step``)."""

    def __init__(self, probe: Probe, index: int) -> None:
        self._probe = probe
        self.index = index
        self.tokens = 0
        self.loss_tokens: torch.Tensor | int = 0
        self._loss: torch.Tensor | float | None = None
        self._phases: list[tuple[str, Any, Any]] = []
        self._phase_seconds: dict[str, float] = {}
        self._paused_s = 0.0
        self._started_s = 0.0
        self.step_time_s: float | None = None
        """Set when the step ends (``Probe.end_step``)."""
        self.eval: EvalContext | None = None

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time a phase (data, forward, backward, optimizer, communication, …); repeats add up; may nest."""
        start = self._probe._clock.mark()
        try:
            yield
        finally:
            self._phases.append((name, start, self._probe._clock.mark()))

    def add_phase(self, name: str, seconds: float) -> None:
        """Add wall-clock seconds to a phase (for callers that see only the edges of a phase, not its body)."""
        self._phase_seconds[name] = self._phase_seconds.get(name, 0.0) + seconds

    def add_tokens(self, tokens: int, loss_tokens: torch.Tensor | int | None = None) -> None:
        """Count tokens the job consumed in this step (for integrations that see batches, not ``forward``)."""
        self.tokens += tokens
        if loss_tokens is not None:
            self.loss_tokens = self.loss_tokens + loss_tokens

    def loss(self, value: torch.Tensor | float) -> None:
        """This rank's mean training loss of the step (a tensor avoids a sync inside the step)."""
        self._loss = value.detach() if isinstance(value, torch.Tensor) else float(value)

    @property
    def has_loss(self) -> bool:
        return self._loss is not None

    @contextlib.contextmanager
    def evaluation(self) -> Iterator[EvalContext]:
        """Evaluate inside the step; the step's clock is paused and the time is reported as phase ``eval``."""
        probe = self._probe
        probe._clock.sync()
        start = time.perf_counter()
        self.eval = EvalContext()
        probe._mode = "eval"
        try:
            yield self.eval
        finally:
            probe._clock.sync()
            probe._mode = "train"
            self._paused_s += time.perf_counter() - start


class Probe:
    """Per-rank step reporter. Build it with ``from_env``; one instance per process."""

    def __init__(
        self,
        *,
        out_dir: Path,
        study_id: str = "local",
        trial_id: str = "local",
        rank: int = 0,
        world_size: int = 1,
        device: torch.device | str = "cpu",
        peak_flops: float | None = None,
        nats_url: str | None = None,
        nkey_file: str | None = None,
        traceparent: str | None = None,
        reduce_across_ranks: bool = True,
    ) -> None:
        self.study_id = study_id
        self.trial_id = trial_id
        self.rank = rank
        self.world_size = world_size
        self.device = torch.device(device)
        self.peak_flops = peak_flops
        self.traceparent = traceparent
        self.reduce_across_ranks = reduce_across_ranks
        self.path = out_dir / f"probe-rank{rank}.jsonl"
        self.subject = telemetry_subject(study_id, trial_id)
        self.cluster_id = "local"
        """The cluster on this probe's events (``INFRARSI_CLUSTER`` of the job, through ``from_env``)."""
        self.flops_per_step: float | None = None
        """This rank's FLOPs per optimiser step, from ``count_flops``."""
        self.optimizer_steps = 0
        """Optimiser steps taken so far, counted by the optimiser hook."""
        self.records: list[events.TrialStep] = []
        """Every record written, in order (handy for callers and tests)."""
        self._clock = _Clock(self.device)
        self._jsonl = JsonlSink(self.path)
        self._nats = NatsPublisher(nats_url, nkey_file=nkey_file) if nats_url else None
        self._mode: str | None = None  # "train" inside a step, "eval" inside an evaluation
        self._current: StepContext | None = None
        self._next_index = 0
        self._hooks: list[Any] = []
        self._counter: TokenCounter = count_tokens_default
        self._watched: tuple[torch.Tensor, float | None] | None = None  # a parameter, its update count
        self._optimizer_depth = 0
        self.shape: events.WorkloadShape | None = None
        """The model's shape (``describe``), sent with the first record."""
        self._shape_sent = False

    @classmethod
    def from_env(
        cls,
        *,
        device: torch.device | str | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        peak_flops: float | None = None,
        out_dir: Path | str | None = None,
    ) -> Probe:
        """Configure from the environment the launcher sets.

        ``INFRARSI_PROBE_DIR`` (default ``./.infrarsi/probe``), ``INFRARSI_STUDY``, ``INFRARSI_TRIAL``,
        ``INFRARSI_NATS_URL`` (publish only when it and ``INFRARSI_TRIAL`` are set), ``INFRARSI_TRACEPARENT``,
        ``INFRARSI_PEAK_FLOPS`` (per device FLOP/s, for MFU; an explicit ``peak_flops`` wins),
        ``INFRARSI_DETERMINISTIC`` (turn torch's deterministic algorithms on: ``enable_determinism``).
        An explicit ``out_dir`` wins over ``INFRARSI_PROBE_DIR``.
        Rank and world size come from ``torch.distributed`` when initialised, else ``RANK``/``WORLD_SIZE``.
        """
        job = JobEnv.from_env()
        if job.deterministic:
            enable_determinism()
        dist = torch.distributed
        if rank is None:
            rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else int(os.environ.get("RANK", "0"))
        if world_size is None:
            initialised = dist.is_available() and dist.is_initialized()
            world_size = dist.get_world_size() if initialised else int(os.environ.get("WORLD_SIZE", "1"))
        probe = cls(
            out_dir=Path(out_dir or job.probe_dir or Path.cwd() / ".infrarsi" / "probe"),
            study_id=job.study,
            trial_id=job.trial or "local",
            rank=rank,
            world_size=world_size,
            device=device or "cpu",
            peak_flops=peak_flops if peak_flops is not None else job.peak_flops,
            nats_url=job.nats_url if job.trial else None,
            nkey_file=os.environ.get(NKEY_FILE_ENV),
            traceparent=job.traceparent,
        )
        probe.cluster_id = job.cluster
        return probe

    @classmethod
    def launched(cls, **kwargs: Any) -> Probe | None:
        """``from_env`` when the job runs under InfraRSI (``INFRARSI_TRIAL`` or ``INFRARSI_PROBE_DIR`` set),
        else ``None``: an integration left in a job run by hand writes nothing and hooks nothing."""
        job = JobEnv.from_env()
        if not (job.trial or job.probe_dir or kwargs.get("out_dir")):
            return None
        return cls.from_env(**kwargs)

    # -- wiring -----------------------------------------------------------------------------------------

    def attach(
        self,
        *,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        count_tokens: TokenCounter = count_tokens_default,
    ) -> None:
        """Hook the model (tokens per forward) and the optimiser (steps actually taken).

        Attach the *unwrapped* model whose ``forward`` receives the token ids (hooks fire through DDP/FSDP
        wrappers); compile its inner blocks rather than the module the probe hooks.
        """
        self._counter = count_tokens
        if model is not None:
            self.describe(model)
            self._hooks.append(model.register_forward_pre_hook(self._on_forward, with_kwargs=True))
        if optimizer is not None:
            self._hooks.append(optimizer.register_step_pre_hook(self._before_optimizer_step))
            self._hooks.append(optimizer.register_step_post_hook(self._on_optimizer_step))

    def describe(self, model: torch.nn.Module) -> None:
        """Read the model's shape (``infrarsi.probe.shape``) to send with the first record; ``attach`` does
        it for the model it hooks."""
        from infrarsi.probe.shape import read_shape

        self.shape = read_shape(model, seq_len=self.shape.seq_len if self.shape is not None else None)

    def saw_inputs(self, inputs: Any) -> None:
        """The token ids of a training forward: the first one gives the shape its sequence length."""
        if self.shape is not None and self.shape.sources.get("seq_len") != "inputs" and isinstance(inputs, torch.Tensor):
            if inputs.dim() >= 2:
                sources = {**self.shape.sources, "seq_len": "inputs"}
                self.shape = msgspec.structs.replace(self.shape, seq_len=int(inputs.shape[-1]), sources=sources)

    def _on_forward(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if self._mode is None or self._current is None:
            return
        if self._mode == "train" and not self._shape_sent:
            self.saw_inputs(model_inputs(args, kwargs))
        tokens, loss_tokens = self._counter(args, kwargs)
        if self._mode == "eval" and self._current.eval is not None:
            self._current.eval.tokens += tokens
            return
        self._current.tokens += tokens
        if loss_tokens is not None:
            self._current.loss_tokens = self._current.loss_tokens + loss_tokens

    # The hooks fire once per hooked ``step`` on the call stack: an optimiser subclass whose ``step`` calls
    # ``super().step()`` runs them twice, so only the outermost pair counts.

    def _before_optimizer_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._optimizer_depth += 1
        if self._optimizer_depth == 1:
            self._watched = _watched_parameter(optimizer)

    def _on_optimizer_step(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        self._optimizer_depth = max(0, self._optimizer_depth - 1)
        if self._optimizer_depth:
            return
        watched, self._watched = self._watched, None
        after = _state_step(optimizer, watched[0]) if watched is not None else None
        if after is None or watched is None or watched[1] is None or after > watched[1]:
            self.optimizer_steps += 1  # an optimiser that keeps no count is taken at its word

    @contextlib.contextmanager
    def count_flops(self, multiplier: int = 1) -> Iterator[None]:
        """Count FLOPs of the enclosed work once; ``multiplier`` scales it to one optimiser step
        (e.g. gradient-accumulation micro-batches when the block runs one micro-batch)."""
        from torch.utils.flop_counter import FlopCounterMode

        counter = FlopCounterMode(display=False)
        with counter:
            yield
        self.flops_per_step = float(counter.get_total_flops()) * multiplier

    # -- steps ----------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def step(self, index: int | None = None) -> Iterator[StepContext]:
        """Time one optimiser step; on normal exit write its record (an exception writes nothing)."""
        s = self.begin_step(index)
        try:
            yield s
            self.end_step(s)
        finally:
            self._current, self._mode = None, None
        self.write_step(s)

    # The three calls ``step()`` is made of, for integrations whose framework calls them from separate hooks
    # (a Trainer callback sees the start and the end of a step, then the loss and the evaluation after it).

    def begin_step(self, index: int | None = None, *, started_at: float | None = None) -> StepContext:
        """Start one optimiser step: tokens and loss tokens count towards it from now on.

        ``started_at`` (a ``time.perf_counter()`` value) backdates the start, for a framework that fetches
        the step's data before it tells anyone that the step began."""
        s = StepContext(self, self._next_index if index is None else index)
        self._next_index = s.index + 1
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self._clock.sync()
        s._started_s = time.perf_counter() if started_at is None else started_at
        self._current, self._mode = s, "train"
        return s

    def end_step(self, s: StepContext) -> None:
        """Stop the step's clock (synchronised); nothing counts towards it any more."""
        self._clock.sync()
        s.step_time_s = time.perf_counter() - s._started_s - s._paused_s
        self._current, self._mode = None, None

    def open_evaluation(self, s: StepContext) -> EvalContext:
        """Start counting eval tokens for ``s`` after its clock stopped (the framework evaluates between steps)."""
        s.eval = EvalContext()
        self._current, self._mode = s, "eval"
        return s.eval

    def close_evaluation(self) -> None:
        self._current, self._mode = None, None

    def write_step(self, s: StepContext) -> events.TrialStep:
        """Write the record of an ended step (JSONL, then NATS when configured) and return it."""
        if s.step_time_s is None:
            raise RuntimeError(f"probe: step {s.index} is written before it ended")
        return self._record(s, s.step_time_s)

    def _record(self, s: StepContext, step_time_s: float) -> events.TrialStep:
        phases: dict[str, float] = dict(s._phase_seconds)
        for name, start, end in s._phases:
            phases[name] = phases.get(name, 0.0) + self._clock.seconds(start, end)
        if s._paused_s:
            phases["eval"] = phases.get("eval", 0.0) + s._paused_s

        loss = float(s._loss) if s._loss is not None else math.nan
        loss_tokens = float(s.loss_tokens)
        ev = s.eval
        eval_loss = float(ev._loss) if ev is not None and ev._loss is not None else None
        eval_tokens = ev.tokens if ev is not None else None
        tokens = float(s.tokens)
        flops = self.flops_per_step
        if self.reduce_across_ranks and self.world_size > 1 and torch.distributed.is_initialized():
            t0 = time.perf_counter()
            comm_device = self.device if torch.distributed.get_backend() == "nccl" else torch.device("cpu")
            totals = torch.tensor(
                [
                    tokens,
                    loss_tokens,
                    loss * loss_tokens,
                    float(eval_tokens or 0),
                    (eval_loss or 0.0) * float(eval_tokens or 0),
                    flops or 0.0,
                ],
                dtype=torch.float64,
                device=comm_device,
            )
            torch.distributed.all_reduce(totals)
            tokens, loss_tokens, weighted, eval_tokens_total, eval_weighted, flops_total = totals.tolist()
            loss = weighted / loss_tokens if loss_tokens else loss
            if eval_tokens is not None:
                eval_tokens = int(eval_tokens_total)
                eval_loss = eval_weighted / eval_tokens_total if eval_tokens_total else eval_loss
            flops = flops_total if flops is not None else None
            phases["probe_reduce"] = time.perf_counter() - t0
        elif flops is not None:
            flops = flops * self.world_size

        mfu = None
        if flops is not None and self.peak_flops and step_time_s > 0:
            mfu = flops / (step_time_s * self.peak_flops * self.world_size)
        record = events.TrialStep(
            rank=self.rank,
            world_size=self.world_size,
            step=s.index,
            loss=None if math.isnan(loss) else loss,  # None: the job reported no loss for this step
            step_time_s=step_time_s,
            phases=phases,
            tokens=int(tokens),
            optimizer_steps=self.optimizer_steps,
            loss_tokens=int(loss_tokens),
            peak_memory_bytes=peak_memory_bytes(self.device),
            flops=flops,
            mfu=mfu,
            eval_loss=eval_loss,
            eval_tokens=eval_tokens,
            wall_time=time.time(),
            shape=None if self._shape_sent else self.shape,
            deterministic=torch.are_deterministic_algorithms_enabled(),
        )
        self._shape_sent = True
        self._emit(record)
        return record

    def msg_id(self, step: int) -> str:
        """Deterministic ``Nats-Msg-Id``: a re-published step is dropped by JetStream's dedup window."""
        return step_msg_id(self.trial_id, self.rank, step)

    def _emit(self, record: events.TrialStep) -> None:
        event = events.make_event(
            record,
            study_id=self.study_id,
            trial_id=self.trial_id,
            source="probe",
            cluster_id=self.cluster_id,
            event_id=events.derived_id(self.trial_id, str(self.rank), "step", str(record.step)),
        )
        data = events.encode(event)
        self._jsonl.write(data)
        self.records.append(record)
        if self._nats is not None:
            headers = {"Nats-Msg-Id": self.msg_id(record.step)}
            if self.traceparent:
                headers["traceparent"] = self.traceparent
            self._nats.publish(self.subject, data, headers)

    def close(self) -> None:
        """Remove hooks, flush NATS (bounded wait), close the JSONL file. Idempotent."""
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        if self._nats is not None:
            self._nats.close()
            self._nats = None
        if not self._jsonl._file.closed:
            self._jsonl.close()

    def __enter__(self) -> Probe:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_records(path: Path | str) -> list[events.TrialStep]:
    """Decode a probe JSONL file back into ``TrialStep`` records (a torn last line is skipped)."""
    out: list[events.TrialStep] = []
    for line in Path(path).read_bytes().splitlines():
        if not line.strip():
            continue
        try:
            event = events.decode(line)
        except Exception:
            log.warning("probe: skipping an undecodable line in %s", path)
            continue
        match event.payload:
            case events.TrialStep() as record:
                out.append(record)
            case _:
                pass
    return out
