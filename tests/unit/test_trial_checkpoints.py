"""What verify asks a job to save or resume travels from the launcher to the job as one ``CheckpointRequest``:
the launcher's ``job_env`` fields become ``INFRARSI_*`` variables and the job's ``from_env`` reads back the
same request. The launcher builds it without importing torch; a job reads it at the probe's import path."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from infrarsi.probe.checkpointing import CheckpointRequest
from infrarsi.runtime.settings import JobEnv

REQUESTS = [
    CheckpointRequest(),
    CheckpointRequest(
        save_dir=Path("/state/t1/checkpoint"), save_after_steps=5, final_weights_dir=Path("/state/t1/final")
    ),
    CheckpointRequest(resume_from=Path("/state/t0/checkpoint")),
]


@pytest.mark.parametrize("request_", REQUESTS)
def test_the_job_reads_back_what_the_launcher_asked(request_: CheckpointRequest) -> None:
    environ = JobEnv(study="s1", trial="t1", **request_.job_env()).to_env()
    assert CheckpointRequest.from_env(environ) == request_


def test_the_request_goes_under_the_documented_variables() -> None:
    asked = CheckpointRequest(
        save_dir=Path("/c"), save_after_steps=3, resume_from=Path("/r"), final_weights_dir=Path("/w")
    )
    environ = JobEnv(**asked.job_env()).to_env()
    assert {k: v for k, v in environ.items() if k not in JobEnv().to_env()} == {
        "INFRARSI_CHECKPOINT_DIR": "/c",
        "INFRARSI_CHECKPOINT_STEP": "3",
        "INFRARSI_RESUME_FROM": "/r",
        "INFRARSI_FINAL_WEIGHTS_DIR": "/w",
    }


def test_the_launcher_builds_the_request_jobs_read_without_importing_torch() -> None:
    code = (
        "import sys\n"
        "from infrarsi_services.launcher import service\n"
        "assert 'torch' not in sys.modules, 'the launcher imported torch'\n"
        "from infrarsi.probe.checkpointing import CheckpointRequest\n"
        "assert service.CheckpointRequest is CheckpointRequest\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
