"""Driving a launcher backend from a test: the calling order the launcher uses, for one job."""

from __future__ import annotations

import time

from infrarsi.backends import Backend, JobHandle, JobResult


def run_to_end(backend: Backend, handle: JobHandle, timeout_s: float = 90.0) -> JobResult:
    """``poll`` until the job ends (failing the test after ``timeout_s``), then ``collect`` it."""
    deadline = time.monotonic() + timeout_s
    while not backend.poll(handle):
        assert time.monotonic() < deadline, "job did not finish"
        time.sleep(0.02)
    return backend.collect(handle)
