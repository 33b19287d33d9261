"""Reading a job's files as they grow, and counting its steps in its own output for coarse measurement.

Owns following a file another process appends to (``GrowingFile``: the probe's JSONL, rank 0's node log),
and for a job without a probe, reading its output as it grows, splitting it into lines at ``\\n`` or ``\\r``
(progress bars redraw with ``\\r``), matching the contract's ``measurement.step_regex`` against each line
and noting when the step count went up, on the launcher's clock. The count rule (docs/trials.md):

- a group named ``step`` is the number of steps completed so far (tqdm's ``12/30``);
- a group named ``index`` is the zero-based index of the step just done (``step 11`` → 12 done);
- a group named ``number`` is the step's number as the job prints it, counted from 0 or from 1: the first
  number seen says which (a loop printing ``step 0`` … ``step 29`` and one printing ``step 1`` … ``step 30``
  have both done 30) — what ``infrarsi scaffold`` writes for a plain script, whose base it cannot know;
- without any of them, each matching line is one step.

The count never goes down (a progress bar redrawn for another epoch does not undo steps). Each line is also
read for the train and eval loss, the work done so far (tokens or micro-batches, the largest printed wins) and, on
a step line (the step pattern matched), the step time the job printed (``infrarsi.trial.joblog``: its default
patterns and the contract's); a loss belongs to the step count reached
with its line, the last print of a step winning. It derives no statistics: telemetry turns the counts,
losses and printed times into a measurement.
"""

from __future__ import annotations

import os
import re
import stat
import time
from pathlib import Path

from infrarsi import events as ev
from infrarsi.trial.joblog import LogPatterns, read_line

_LINE_END = re.compile(rb"[\r\n]")


class OutputSteps:
    """Step counts read from output text, fed in pieces as it arrives."""

    def __init__(self, pattern: str | None, log: LogPatterns | None = None) -> None:
        self.regex = re.compile(pattern) if pattern is not None else None
        self.log = log
        self.steps_done = 0
        self.seen: list[ev.OutputStep] = []
        self.first_number: int | None = None  # the ``number`` group's first value: 0 means counted from 0
        self.losses: dict[int, float] = {}
        self.eval_losses: dict[int, float] = {}
        self.step_times: list[ev.PrintedStepTime] = []
        self.tokens: int | None = None
        self.micro_batches: int | None = None

    def feed_line(self, line: str, seen_s: float) -> None:
        counted = self._count(line, seen_s)
        if self.log is None:
            return
        said = read_line(line, self.log, is_step_line=counted)
        if said.loss is not None:
            self.losses[self.steps_done] = said.loss
        if said.eval_loss is not None:
            self.eval_losses[self.steps_done] = said.eval_loss
        if said.step_time_s is not None:
            self.step_times.append(ev.PrintedStepTime(seen_s, said.step_time_s))
        if said.tokens is not None:
            self.tokens = max(said.tokens, self.tokens or 0)
        if said.micro_batches is not None:
            self.micro_batches = max(said.micro_batches, self.micro_batches or 0)

    def loss_curve(self) -> list[ev.LossPoint]:
        return [ev.LossPoint(step, loss) for step, loss in sorted(self.losses.items())]

    def eval_curve(self) -> list[ev.LossPoint]:
        return [ev.LossPoint(step, loss) for step, loss in sorted(self.eval_losses.items())]

    def _count(self, line: str, seen_s: float) -> bool:
        """Count the steps ``line`` says are done; whether it is a step line (the step pattern matched)."""
        match = self.regex.search(line) if self.regex is not None else None
        if match is None:
            return False
        groups = match.groupdict()
        if groups.get("step") is not None:
            done = int(groups["step"])
        elif groups.get("index") is not None:
            done = int(groups["index"]) + 1
        elif groups.get("number") is not None:
            number = int(groups["number"])
            if self.first_number is None:
                self.first_number = number
            done = number + 1 if self.first_number == 0 else number
        else:
            done = self.steps_done + 1
        if done > self.steps_done:
            self.steps_done = done
            self.seen.append(ev.OutputStep(steps_done=done, seen_s=seen_s))
        return True

    def feed_text(self, text: str, seen_s: float) -> None:
        for line in re.split(r"[\r\n]", text):
            self.feed_line(line, seen_s)


def read_regular(path: Path, offset: int = 0) -> bytes:
    """``path``'s bytes from ``offset``, opened without following a symlink and without blocking on a FIFO (a
    trial's own files are the job's to make: a link to a seed, a FIFO that would hang the launcher); ``b""`` when
    it is not a plain file. ``FileNotFoundError`` when it is not there."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise
    except OSError:  # ELOOP: a symlink
        return b""
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            return b""
        fh.seek(offset)
        return fh.read()


class GrowingFile:
    """A file another process is appending to: each ``read_lines`` returns the lines completed since the
    last one, and when they became visible on the launcher's clock (s since ``t0``)."""

    def __init__(self, path: Path, t0: float, line_end: re.Pattern[bytes]) -> None:
        self.path = path
        self.t0 = t0
        self.line_end = line_end
        self.offset = 0
        self.partial = b""
        self.read_any = False

    def read_lines(self, *, final: bool = False) -> tuple[list[bytes], float]:
        """New complete lines (``final``: the writer has ended, so an unterminated last line too)."""
        try:
            # Polled every few ms for the whole trial: one stat when nothing was appended (most polls).
            if os.stat(self.path).st_size == self.offset and not final:
                self.read_any = True
                return [], time.monotonic() - self.t0
            data = read_regular(self.path, self.offset)
        except FileNotFoundError:
            return [], 0.0
        self.read_any = True
        now = time.monotonic() - self.t0
        self.offset += len(data)
        pieces = self.line_end.split(self.partial + data)
        self.partial = b"" if final else pieces.pop()
        return pieces, now


class OutputTail:
    """Follows a job's output and counts steps in each complete line as it becomes visible."""

    def __init__(self, path: Path, t0: float, counter: OutputSteps) -> None:
        self.file = GrowingFile(path, t0, _LINE_END)
        self.counter = counter

    @property
    def read_any(self) -> bool:
        return self.file.read_any

    def poll(self, *, final: bool = False) -> None:
        lines, now = self.file.read_lines(final=final)
        for line in lines:
            self.counter.feed_line(line.decode(errors="replace"), now)
