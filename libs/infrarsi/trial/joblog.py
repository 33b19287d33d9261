"""What a training job's own printed output says, for a job measured without a probe (coarse measurement).

Owns the patterns that read, line by line, the train loss, the eval loss and the step time a job prints,
and ``LogLine``: what one line says. The defaults cover the formats training tools print as their authors
wrote them; a contract adds its own (``workload.measurement.loss_regex`` …), tried before the defaults:

- Hugging Face ``Trainer``'s log dict: ``{'loss': 2.31, 'grad_norm': …}`` and ``{'eval_loss': 2.2, …}``
  (values quoted or not);
- Lightning's progress bar: ``… loss=2.31`` / ``train_loss=2.31`` and ``val_loss=2.2``;
- a plain loop: ``iter 12: loss 2.31, time 81.20ms`` (nanoGPT), ``step 12 | loss 2.31 | 812.3 ms``,
  ``Step 12/30, loss=2.31`` and the eval lines ``step 10: train loss 2.3, val loss 2.2`` / ``val_loss 2.2``;
- Megatron-style: ``… | lm loss: 2.310E+00 | …`` and ``validation loss at iteration 10 | lm loss value: 2.2``.

A step time is read only from a line that also says its step (the launcher's step pattern matched it), in
milliseconds (``81.2ms``, ``812.3 ms``, ``elapsed time per iteration (ms): 81.2``) or seconds
(``0.81s/it``, ``time 0.81s``) or a rate (``2.10it/s``). The work done so far is read from any line that
prints it (``DEFAULT_TOKENS_PATTERNS``: tokens, or micro-batches). Reading never fails: a line that matches
nothing says nothing. It does no I/O; the launcher's ``output.py`` feeds it lines as they appear.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf"
"""A printed float (``2.31``, ``2.310E+00``, ``nan``)."""

DEFAULT_LOSS_PATTERNS: tuple[str, ...] = (
    rf"""['"]loss['"]:\s*['"]?(?P<loss>{NUMBER})""",
    rf"\blm loss:\s*(?P<loss>{NUMBER})",
    rf"(?i)\b(?:step|iter|iteration)\b[ \t]*[:=#]?[ \t]*\d+(?:/\d+)?[ \t]*[:|,]?[ \t]*(?:\|[ \t]*)?"
    rf"(?:train[_ ])?loss[ \t]*[:=]?[ \t]*(?P<loss>{NUMBER})",
    rf"(?<![\w.])(?:train_)?loss=(?P<loss>{NUMBER})",
)  # fmt: skip
"""Train loss, in the order tried (the first match of a line wins); a group named ``loss``."""
DEFAULT_EVAL_LOSS_PATTERNS: tuple[str, ...] = (
    rf"""['"]eval_loss['"]:\s*['"]?(?P<loss>{NUMBER})""",
    rf"validation loss at .*?lm loss value:\s*(?P<loss>{NUMBER})",
    rf"(?i)\bval(?:idation)?[_ ]loss[ \t]*[:=]?[ \t]*(?P<loss>{NUMBER})",
)  # fmt: skip
"""Eval loss, tried before the train patterns (an eval line is never read as a train loss)."""
DEFAULT_STEP_TIME_PATTERNS: tuple[str, ...] = (
    rf"(?i)\(ms\):\s*(?P<ms>{NUMBER})",
    rf"(?i)(?<![\w.])(?P<ms>{NUMBER})[ \t]*ms\b",
    rf"(?i)(?<![\w.])(?P<s>{NUMBER})[ \t]*s/it\b",
    rf"(?i)(?<![\w.])(?P<hz>{NUMBER})[ \t]*it/s\b",
    rf"(?i)\btime[ \t]*[:=]?[ \t]*(?P<s>{NUMBER})[ \t]*s\b",
)  # fmt: skip
"""A step time printed on a step line: a group ``ms`` (milliseconds), ``s`` (seconds) or ``hz`` (steps per
second, tqdm's ``2.10it/s``)."""
DEFAULT_TOKENS_PATTERNS: tuple[str, ...] = (
    r"""['"]num_input_tokens_seen['"]:\s*['"]?(?P<tokens>\d+)""",
)  # fmt: skip
"""The training work done so far, as a job prints it: a group ``tokens`` (tokens trained so far: HF ``Trainer``'s
``num_input_tokens_seen`` with ``include_num_input_tokens_seen``) or ``micro_batches`` (micro-batches run so far:
LitGPT's ``iter N``, turned into tokens by the trial's micro-batch and sequence length). The largest value seen
is the trial's."""


@dataclass(frozen=True)
class LogPatterns:
    """The compiled patterns one job's output is read with (the contract's first, then the defaults)."""

    loss: tuple[re.Pattern[str], ...]
    eval_loss: tuple[re.Pattern[str], ...]
    step_time: tuple[re.Pattern[str], ...]
    tokens: tuple[re.Pattern[str], ...] = ()

    @classmethod
    def build(
        cls,
        loss: Sequence[str] = (),
        eval_loss: Sequence[str] = (),
        step_time: Sequence[str] = (),
        tokens: Sequence[str] = (),
        *,
        defaults: bool = True,
    ) -> LogPatterns:
        """The contract's own patterns, then (``defaults``) the built-in ones."""

        def compiled(own: Sequence[str], builtin: tuple[str, ...]) -> tuple[re.Pattern[str], ...]:
            return tuple(re.compile(p) for p in (*own, *(builtin if defaults else ())))

        return cls(
            loss=compiled(loss, DEFAULT_LOSS_PATTERNS),
            eval_loss=compiled(eval_loss, DEFAULT_EVAL_LOSS_PATTERNS),
            step_time=compiled(step_time, DEFAULT_STEP_TIME_PATTERNS),
            tokens=compiled(tokens, DEFAULT_TOKENS_PATTERNS),
        )


@dataclass(frozen=True)
class LogLine:
    """What one printed line says (``None``: not said)."""

    loss: float | None = None
    eval_loss: float | None = None
    step_time_s: float | None = None
    tokens: int | None = None
    """Tokens trained so far, as printed."""
    micro_batches: int | None = None
    """Micro-batches run so far, as printed."""


def read_line(line: str, patterns: LogPatterns, *, is_step_line: bool) -> LogLine:
    """The train or eval loss of ``line`` and, on a step line, the step time it prints."""
    eval_loss = _first(patterns.eval_loss, line, "loss")
    loss = None if eval_loss is not None else _first(patterns.loss, line, "loss")
    step_time = None
    if is_step_line:
        for groups in _matches(patterns.step_time, line):
            if groups.get("ms") is not None:
                step_time = _float(groups["ms"]) / 1000.0
            elif groups.get("s") is not None:
                step_time = _float(groups["s"])
            elif groups.get("hz") is not None:
                rate = _float(groups["hz"])
                step_time = 1.0 / rate if rate > 0 else None
            if step_time is not None and math.isfinite(step_time) and step_time > 0:
                break
            step_time = None
    tokens = micro_batches = None
    groups = next(_matches(patterns.tokens, line), {})  # the first pattern that matches says it
    if groups.get("tokens") is not None:
        tokens = int(groups["tokens"])
    elif groups.get("micro_batches") is not None:
        micro_batches = int(groups["micro_batches"])
    return LogLine(loss=loss, eval_loss=eval_loss, step_time_s=step_time, tokens=tokens, micro_batches=micro_batches)


def _matches(patterns: tuple[re.Pattern[str], ...], line: str) -> Iterator[dict[str, str | Any]]:
    """The named groups of each pattern that matches ``line``, in the patterns' order."""
    for pattern in patterns:
        match = pattern.search(line)
        if match is not None:
            yield match.groupdict()


def _first(patterns: tuple[re.Pattern[str], ...], line: str, group: str) -> float | None:
    for pattern in patterns:
        match = pattern.search(line)
        if match is not None and match.groupdict().get(group) is not None:
            return _float(match.group(group))
    return None


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan
