"""What ``infrarsi trial`` says while it works (its ``Progress``), and the host peak measurement it starts
with: only the dtypes the CPU runs natively, within a time bound, saying what it measured."""

from __future__ import annotations

import io

from infrarsi import events as ev
from infrarsi.commands.trial import Progress
from infrarsi.verdicts import doctor


def step(i: int) -> ev.TrialStep:
    return ev.TrialStep(rank=0, world_size=1, step=i, loss=2.0, step_time_s=0.25, tokens=10, optimizer_steps=i + 1,
                        peak_memory_bytes=1, flops=None)  # fmt: skip


def test_plain_lines_when_not_a_terminal() -> None:
    out = io.StringIO()
    progress = Progress(out, tty=False, min_interval_s=3600)
    progress.phase("baseline: running trial t1")
    for i in range(5):
        progress.step("baseline", step(i), 5)
    progress.phase("baseline: finished ok")
    progress.close()
    assert out.getvalue().splitlines() == [
        "[trial] baseline: running trial t1",
        "[trial] baseline: step 1/5  250 ms  loss 2",  # the first and the last step; the rest within the interval
        "[trial] baseline: step 5/5  250 ms  loss 2",
        "[trial] baseline: finished ok",
    ]
    assert "\r" not in out.getvalue()


def test_every_step_redraws_one_line_on_a_terminal() -> None:
    out = io.StringIO()
    progress = Progress(out, tty=True)
    for i in range(3):
        progress.step("candidate 1/1", step(i), 3)
    progress.phase("candidate 1/1: measured ok")
    text = out.getvalue()
    assert text.count("\r") == 3 and "step 3/3" in text
    assert text.endswith("\n[trial] candidate 1/1: measured ok\n")


def test_peak_measures_only_native_dtypes_and_says_so() -> None:
    without = "processor : 0\nflags : fpu sse avx2 avx512f\n"
    assert doctor.native_matmul_dtypes(without) == (
        ("float32",), {"bfloat16": "no native bf16 matmul on this CPU (no avx512_bf16/amx_bf16/bf16 flag)"})
    assert doctor.native_matmul_dtypes("flags : avx2 avx512_bf16\n")[0] == ("float32", "bfloat16")
    assert doctor.native_matmul_dtypes("Features : fp asimd bf16\n")[0] == ("float32", "bfloat16")  # arm64


def test_peak_measurement_is_bounded_in_time() -> None:
    measured = doctor.measure_cpu_peak(1, dtypes=("float32",), budget_s=0.3)
    assert measured.seconds < 2.0 and measured.dtype == "float32" and measured.flops > 1e7
    assert "measured at" in measured.skipped["float32"] and "float32" in measured.describe()


def test_a_bound_too_short_for_any_timed_product_still_gives_a_noted_low_bound() -> None:
    # a host so loaded that the sizing product alone takes the bound: that product is the measurement
    measured = doctor.measure_cpu_peak(1, dtypes=("float32",), budget_s=1e-6)
    assert measured.dtype == "float32" and measured.flops > 0
    assert "sizing product only (a low bound)" in measured.skipped["float32"]
