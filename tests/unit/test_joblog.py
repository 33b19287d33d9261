"""The coarse mode's reading of a job's own output (issue 35): the train and eval loss in the formats training
tools print, and the step times a plain loop prints, fed line by line as the launcher does."""

from __future__ import annotations

import math

import pytest
from infrarsi import events as ev
from infrarsi.study.contract import MeasurementSpec
from infrarsi.study.scaffold import default_step_regex
from infrarsi.trial.joblog import LogPatterns, read_line
from infrarsi_services.launcher.output import OutputSteps
from pydantic import ValidationError

DEFAULTS = LogPatterns.build()

LINES = {
    "HF Trainer": ("{'loss': 2.3456, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 0.1}", 2.3456, None),
    "HF Trainer, quoted": ("{'loss': '2.3456', 'grad_norm': '1.2', 'epoch': '0.1'}", 2.3456, None),
    "HF Trainer eval": ("{'eval_loss': 2.1, 'eval_runtime': 0.5, 'epoch': 0.2}", None, 2.1),
    "Lightning bar": ("Epoch 0:  40%|████      | 12/30 [00:05<00:07, 2.10it/s, v_num=0, train_loss=2.310]", 2.31, None),
    "Lightning bar, loss=": ("Epoch 0: 12/30 [00:05<00:07, loss=2.31, v_num=0]", 2.31, None),
    "Lightning val": ("Epoch 0: 30/30 [00:12<00:00, train_loss=2.1, val_loss=2.200]", None, 2.2),
    "nanoGPT": ("iter 12: loss 2.3100, time 81.20ms, mfu -100.00%", 2.31, None),
    "nanoGPT eval": ("step 10: train loss 2.3000, val loss 2.2000", None, 2.2),
    "plain": ("step 12 | loss 2.3100 | 812.3 ms", 2.31, None),
    "plain, key=value": ("Step 12/30, loss=2.31", 2.31, None),
    "Megatron": (" iteration       12/     100 | consumed samples: 96 | elapsed time per iteration (ms): 81.2 | "
                 "learning rate: 1.0E-04 | lm loss: 2.310000E+00 | loss scale: 1.0 |", 2.31, None),
    "Megatron eval": (" validation loss at iteration 10 | lm loss value: 2.200000E+00 | lm loss PPL: 9.0 |", None, 2.2),
    "an argument dump": ("Namespace(max_steps=30, loss_scale=1.0, eval_loss_every=5)", None, None),
    "a learning rate": ("step 3 | lr 0.0003 | 80 ms", None, None),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(LINES))
def test_default_patterns_read_the_common_formats(name: str) -> None:
    line, loss, eval_loss = LINES[name]
    said = read_line(line, DEFAULTS, is_step_line=False)
    assert said.loss == pytest.approx(loss) if loss is not None else said.loss is None, said
    assert said.eval_loss == pytest.approx(eval_loss) if eval_loss is not None else said.eval_loss is None, said


@pytest.mark.parametrize(
    ("line", "seconds"),
    [
        ("iter 12: loss 2.3100, time 81.20ms, mfu -100.00%", 0.0812),
        ("step 12 | loss 2.31 | 812.3 ms", 0.8123),
        (" iteration 12/ 100 | elapsed time per iteration (ms): 81.2 | lm loss: 2.3", 0.0812),
        ("12/30 [00:05<00:07,  1.50s/it]", 1.5),
        ("12/30 [00:05<00:07,  2.00it/s]", 0.5),
        ("step 12 loss 2.31", None),
    ],
)
def test_step_times_are_read_from_step_lines_only(line: str, seconds: float | None) -> None:
    said = read_line(line, DEFAULTS, is_step_line=True)
    assert said.step_time_s == pytest.approx(seconds) if seconds is not None else said.step_time_s is None
    assert read_line(line, DEFAULTS, is_step_line=False).step_time_s is None


def test_the_contracts_patterns_come_first_and_defaults_can_be_off() -> None:
    own = LogPatterns.build([r"objective=(?P<loss>[0-9.]+)"], defaults=False)
    assert read_line("step 3 objective=1.5 loss 9.0", own, is_step_line=False).loss == 1.5
    assert read_line("step 3 loss 9.0", own, is_step_line=False).loss is None
    both = LogPatterns.build([r"objective=(?P<loss>[0-9.]+)"])
    assert read_line("step 3 | loss 9.0", both, is_step_line=False).loss == 9.0


def test_a_non_finite_loss_is_kept_as_nan() -> None:
    assert math.isnan(read_line("iter 3: loss nan, time 80.0ms", DEFAULTS, is_step_line=False).loss or 0.0)


def test_the_output_reader_files_each_loss_under_its_step() -> None:
    log = "".join(
        (f"step {i}: train loss {4 - i / 10:.4f}, val loss {4.1 - i / 10:.4f}\n" if i % 4 == 0 else "")
        + f"iter {i}: loss {4 - i / 10:.4f}, time {20 + i}.00ms\n"
        for i in range(9)
    )  # nanoGPT's shape: max_iters=8 runs iterations 0 … 8
    counter = OutputSteps(default_step_regex("plain"), DEFAULTS)
    counter.feed_text(log, 1.0)
    assert counter.steps_done == 9
    assert counter.loss_curve() == [ev.LossPoint(i + 1, pytest.approx(4 - i / 10)) for i in range(9)]
    assert [p.step for p in counter.eval_curve()] == [1, 5, 9]  # the eval line is read at the count it reaches
    assert [t.step_time_s for t in counter.step_times] == pytest.approx([(20 + i) / 1000 for i in range(9)])


def test_log_patterns_are_validated() -> None:
    with pytest.raises(ValidationError, match="no group named loss"):
        MeasurementSpec(kind="coarse", loss_regex=[r"loss (\d+)"])
    with pytest.raises(ValidationError, match="no group named hz or ms or s"):
        MeasurementSpec(kind="coarse", step_time_regex=[r"(?P<loss>\d+)"])
    with pytest.raises(ValidationError, match="not a regular expression"):
        MeasurementSpec(kind="coarse", eval_loss_regex=["(unclosed"])
    with pytest.raises(ValidationError, match="only used with kind: coarse"):
        MeasurementSpec(kind="probe", loss_regex=[r"(?P<loss>\d+)"])


def test_litgpts_output_is_read_for_its_optimiser_steps_and_losses() -> None:
    from infrarsi.study.scaffold import TOOL_LOGS

    tool = TOOL_LOGS["litgpt"]
    log = "".join(  # LitGPT 0.5's pretrain with 4 micro-batches per step and an eval every 2 steps
        f"Epoch 1 | iter {4 * s} step {s} | loss train: {6 - s / 10:.3f}, val: n/a | iter time: 176.69 ms (step) "
        f"remaining time: 0:00:03\n" + (f"Validating ...\niter {4 * s}: val loss {5.5 - s / 10:.4f}, val time: 12.00 ms\n"
                                         if s % 2 == 0 else "")
        for s in range(1, 7)
    ) + "Final evaluation | val loss: 4.925 | val ppl: 137.701\n"
    counter = OutputSteps(tool.step_regex, LogPatterns.build(tool.loss_regex, tool.eval_loss_regex,
                                                             tokens=tool.tokens_regex, defaults=False))  # fmt: skip
    counter.feed_text(log, 1.0)
    assert counter.steps_done == 6  # optimiser steps, not the micro-batches `iter 24` counts
    assert counter.loss_curve() == [ev.LossPoint(s, pytest.approx(6 - s / 10)) for s in range(1, 7)]
    assert counter.eval_curve() == [ev.LossPoint(2, pytest.approx(5.3)), ev.LossPoint(4, pytest.approx(5.1)),
                                    ev.LossPoint(6, pytest.approx(4.925))]  # the final eval: the last wins
    assert counter.step_times == []  # `iter time` is the last micro-batch's, not the step's
    assert counter.micro_batches == 24 and counter.tokens is None  # `iter 24`: micro-batches, for work.tokens


def test_hf_trainers_printed_tokens_are_read_and_the_largest_wins() -> None:
    counter = OutputSteps(r"(?P<step>\d+)/\d+ \[", LogPatterns.build())
    counter.feed_text("{'loss': 2.5, 'num_input_tokens_seen': 2048, 'epoch': 0.1}\n"
                      "{'loss': 2.4, 'num_input_tokens_seen': '4096'}\n{'eval_loss': 2.2, 'num_input_tokens_seen': 4096}\n", 1.0)
    assert counter.tokens == 4096 and counter.micro_batches is None
    with pytest.raises(ValidationError, match="no group named micro_batches or tokens"):
        MeasurementSpec(kind="coarse", tokens_regex=[r"seen (\d+)"])
