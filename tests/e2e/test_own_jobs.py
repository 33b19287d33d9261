"""The own-job examples as a user runs them: a Hugging Face Trainer job and a Lightning job, each with the
one-line callback and the contract ``infrarsi scaffold`` drafted (narrowed by hand), through ``infrarsi
trial`` and through the five stages (``infrarsi demo``: init → doctor → run → verify → report).

All slow (minutes each on this CPU): ``make test-slow`` or ``pytest -m slow tests/e2e/test_own_jobs.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
STEPS = 10  # the examples evaluate every 10 steps (HF also after its last step; Lightning only on the interval)
GLOBAL_BATCH, SEQ_LEN = 16, 64
FASTER = {"hf-trainer": ["--set", "bf16=true", "--set", "per_device_train_batch_size=16"],
          "lightning": ["--set", "precision=bf16-mixed", "--set", "batch-size=16"]}

pytestmark = pytest.mark.slow


@pytest.fixture(params=sorted(FASTER))
def example(request: pytest.FixtureRequest) -> str:
    return request.param


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("INFRARSI_")}


def infrarsi_trial(data_dir: Path, example: str, *args: str) -> tuple[int, dict]:
    proc = subprocess.run(
        [sys.executable, "-m", "infrarsi.cli", "trial", str(EXAMPLES / example / "contract.yaml"),
         "--data-dir", str(data_dir), "--steps", str(STEPS), "--json", *args],
        capture_output=True, text=True, timeout=1700, env=_clean_env(),
    )  # fmt: skip
    assert proc.stdout.strip(), proc.stderr[-3000:]
    return proc.returncode, json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(1800)
def test_trial_on_each_example_is_ok_with_tokens_mfu_and_peak_memory(example: str, tmp_path: Path) -> None:
    code, report = infrarsi_trial(tmp_path, example, *FASTER[example])
    assert code == 0, report
    for run in (report["baseline"], report["candidate"][0]):
        m, f = run["measured"], run["finished"]
        assert f["status"] == "ok" and m["status"] == "ok", (f.get("output_tail"), m["invariants"])
        assert m["steps"] == STEPS and m["optimizer_steps"] == STEPS
        assert m["tokens"] == STEPS * GLOBAL_BATCH * SEQ_LEN
        assert m["mfu"] is not None and 0 < m["mfu"] < 1
        assert m["peak_memory_bytes"][0] > 0
        assert m["shape"]["seq_len"] == SEQ_LEN and m["shape"]["layers"] == 2
    assert report["candidate"][0]["measured"]["invariants_ok"]


@pytest.mark.timeout(1800)
def test_a_reward_hack_on_each_example_is_rejected_by_name(example: str, tmp_path: Path) -> None:
    code, report = infrarsi_trial(tmp_path, example, "--patch", "hack-skip-optimizer-steps")
    m = report["candidate"][0]["measured"]
    assert code == 3 and m["status"] == "invariant_violation"
    assert [i["name"] for i in m["invariants"] if not i["ok"]] == ["work.optimizer_steps"], m["invariants"]


@pytest.mark.timeout(3600)
def test_five_stages_on_each_example_verify_a_speedup(example: str, tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "infrarsi.cli", "--data-dir", str(tmp_path / "data"), "demo",
         "--contract", str(EXAMPLES / example / "contract.yaml"), "--trials", "6", "--json"],
        cwd=ROOT, env=_clean_env(), capture_output=True, text=True, timeout=3500,
    )  # fmt: skip
    out = proc.stdout
    summary = json.loads(out[out.index("{\n"):]) if "{\n" in out else {}
    print(out)  # the run's figures (speed-up, CI, ms/step, MFU, trials): shown by `pytest -rA`
    assert proc.returncode == 0 and summary["verified"], (out + proc.stderr)[-4000:]
    assert summary["speedup_ci"][0] > 1.0, summary
    loss = [i for i in summary["invariants"] if i["name"] == "loss"]
    assert loss and all(i["ok"] for i in loss), summary["invariants"]  # e.g. "held on 6 checks": compared
    assert all(not i["detail"].startswith("not checked") for i in loss), loss
    assert summary["unchecked_invariants"] == []
    assert Path(summary["report"]).is_file()
