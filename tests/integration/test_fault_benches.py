"""The fault benchmarks at a small size (slow: each starts real stacks and kills their processes).

Covers: bench/chaos.py — a simulator study with every service SIGKILLed three times and the nats-server once
loses no trial, duplicates nothing, and leaves the analyst DB equal to a fresh replay; bench/fuzz_bus.py —
bad messages of every kind on every consumed subject crash nothing, are all dead-lettered with a reason, and
the study that follows has the result of the same study on a clean stack; bench/chaos_cluster.py — a study on a
3-node TLS cluster in network namespaces, its stream leader SIGKILLed and restarted and then a node partitioned
away and healed, loses no acknowledged event and ends with the result of the same study on one node.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from infrarsi.trial import netns

pytestmark = [pytest.mark.integration, pytest.mark.slow]

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _run(script: str, *args: str, timeout_s: float) -> dict:
    done = subprocess.run([sys.executable, str(BENCH / script), *args, "--json"], capture_output=True, text=True,
                          timeout=timeout_s)  # fmt: skip
    assert done.stdout.strip(), done.stderr[-3000:]
    return json.loads(done.stdout) | {"returncode": done.returncode}


@pytest.mark.timeout(900)
def test_chaos_small() -> None:
    result = _run("chaos.py", "--trials", "12", "--kills", "18", "--nats-kills", "1", timeout_s=850)
    assert result["study_finished"]
    assert result["service_kills_during_study"] >= 12 and min(result["kills_per_service"].values()) >= 3
    assert result["nats_kills"] == 1
    assert result["trials_lost"] == 0 and result["duplicate_event_ids"] == 0 and result["trials_finished_twice"] == 0
    assert result["trials_proposed"] == result["trials_finished"] == result["trials_measured"]
    assert result["analyst_db_equals_replay"], result["tables"]
    assert result["returncode"] == 0


@pytest.mark.timeout(900)
def test_fuzz_bus_small() -> None:
    result = _run("fuzz_bus.py", "--messages", "300", "--oversized", "2", "--trials", "4", timeout_s=850)
    assert set(result["per_kind"]) == {"malformed", "truncated", "oversized", "wrong_typed", "deep", "wrong_owner"}
    assert result["crashes"] == 0 and not result["health_after_study"]["stalled"]
    assert result["dead_lettered_share"] == 1.0 and result["letters_without_reason"] == 0
    assert result["study_unaffected"], (result["result"], result["reference_result"])
    assert result["returncode"] == 0


@pytest.mark.timeout(1200)
def test_chaos_cluster_small() -> None:
    if (reason := netns.unavailable_reason()) is not None:
        pytest.skip(reason)
    result = _run("chaos_cluster.py", "--trials", "12", "--down-s", "6", timeout_s=1150)
    assert result["study_finished"]
    assert [f["fault"].split(",")[0] for f in result["faults"]] == ["killed (SIGKILL)", "restarted", "partitioned",
                                                                   "healed", "healthy"]
    assert result["acks_received"] > 0 and result["acked_lost"] == 0, result["acked_lost_examples"]
    assert result["trials_lost"] == 0 and result["duplicate_event_ids"] == 0 and result["trials_finished_twice"] == 0
    assert result["same_result_as_single_node"], (result["result"], result["single_node_result"])
    assert result["returncode"] == 0
