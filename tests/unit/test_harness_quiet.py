"""The harness keeps out of a running trial's way: services niced and, with cores to spare, on a core of their own;
the doctor reports the share of the host's CPU the harness took while the baseline ran."""

from __future__ import annotations

import pytest
from infrarsi import events as ev
from infrarsi.commands.doctor import harness_share
from infrarsi.runtime.stack import SERVICE_NICE, StackError, service_placement


def test_on_two_cores_only_niceness_separates_the_services_from_the_trials() -> None:
    assert service_placement("launcher", [0, 1], env={}) == service_placement("launcher", [0, 1], env={})
    launcher, modeler = service_placement("launcher", [0, 1], env={}), service_placement("modeler", [0, 1], env={})
    assert launcher.nice == 0 and launcher.cpus is None  # its trial jobs inherit both
    assert modeler.nice == SERVICE_NICE > 0 and modeler.cpus is None


def test_with_cores_to_spare_the_services_get_the_last_core_and_the_trials_the_rest() -> None:
    cores = range(8)
    assert service_placement("launcher", cores, env={}).cpus == frozenset(range(7))
    for name in ("proposer", "modeler", "telemetry", "reporter", "verifier"):
        assert service_placement(name, cores, env={}).cpus == frozenset({7})


def test_the_niceness_is_overridable_and_a_bad_value_is_named() -> None:
    assert service_placement("reporter", [0, 1], env={"INFRARSI_SERVICE_NICE": "0"}).nice == 0
    with pytest.raises(StackError, match="INFRARSI_SERVICE_NICE='high'"):
        service_placement("reporter", [0, 1], env={"INFRARSI_SERVICE_NICE": "high"})


def test_harness_share_is_cpu_seconds_per_core_second_of_the_runs() -> None:
    runs = [ev.TrialFinished(status="ok", wall_s=10.0, harness_cpu_s=1.0),
            ev.TrialFinished(status="ok", wall_s=20.0, harness_cpu_s=6.0)]
    assert harness_share(runs, cores=2) == pytest.approx((0.05 + 0.15) / 2)
    assert harness_share([ev.TrialFinished(status="ok", wall_s=10.0)], cores=2) is None  # not measured
