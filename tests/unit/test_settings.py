"""The one place ``INFRARSI_*`` variables are read: parsing, defaults, the error that names the variable, and
the job environment the launcher hands a job."""

from __future__ import annotations

from pathlib import Path

import pytest
from infrarsi import cli, errors
from infrarsi.runtime.settings import JobEnv, Settings, SettingsError, env_var


def test_defaults_and_values_from_the_environment() -> None:
    assert Settings.from_env({}) == Settings()
    assert Settings().data_dir == Path(".infrarsi") and Settings().replicas == 1 and Settings().cluster == "local"
    got = Settings.from_env({"INFRARSI_REPLICAS": "3", "INFRARSI_DATA_DIR": "/srv/irsi", "INFRARSI_LOG_LEVEL": "Debug",
                             "INFRARSI_LAUNCHER_SLOTS": "4", "INFRARSI_NATS_URL": "", "INFRARSI_SIM_SCENARIO": "not ours"})
    assert (got.replicas, got.data_dir, got.log_level, got.launcher_slots, got.nats_url) == (
        3, Path("/srv/irsi"), "Debug", 4, None), "empty means unset; variables of other modules are ignored"


@pytest.mark.parametrize(("var", "value", "why"), [
    ("INFRARSI_REPLICAS", "three", "integer"),
    ("INFRARSI_REPLICAS", "0", "greater than or equal to 1"),
    ("INFRARSI_CLUSTER", "a.b", "pattern"),
    ("INFRARSI_LOG_LEVEL", "nonsense", "NONSENSE"),
    ("INFRARSI_LAUNCHER_ACK_WAIT_S", "-1", "greater than 0"),
])
def test_a_bad_value_names_its_variable(var: str, value: str, why: str) -> None:
    with pytest.raises(SettingsError, match=why) as caught:
        Settings.from_env({var: value})
    assert str(caught.value).startswith(f"{var}={value!r}: ") and caught.value.exit_code == errors.EXIT_USAGE


def test_the_cli_stops_on_a_bad_setting_before_anything_runs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("INFRARSI_REPLICAS", "many")
    assert cli.main(["status"]) == errors.EXIT_USAGE
    assert capsys.readouterr().err.startswith("error: INFRARSI_REPLICAS='many': ")


def test_job_env_round_trips_through_the_variables_the_probe_reads() -> None:
    job = JobEnv(study="s1", trial="t1", probe_dir=Path("/tmp/p"), nats_url="nats://h:4222", cluster="c1",
                 traceparent="00-ab-cd-01", peak_flops=2e12)
    env = job.to_env()
    assert env_var("trial") == "INFRARSI_TRIAL" and env["INFRARSI_TRIAL"] == "t1"
    assert set(env) == {"INFRARSI_STUDY", "INFRARSI_TRIAL", "INFRARSI_PROBE_DIR", "INFRARSI_NATS_URL",
                        "INFRARSI_CLUSTER", "INFRARSI_TRACEPARENT", "INFRARSI_PEAK_FLOPS"}
    assert JobEnv.from_env(env) == job


def test_the_slurm_sacct_switch_reaches_the_backend_from_the_settings(tmp_path: Path) -> None:
    """``INFRARSI_SLURM_SACCT_COMPLETION`` is read into ``Settings`` and handed to the Slurm backend by
    ``make_backend``; a value that is no boolean names the variable."""
    from infrarsi.backends import make_backend
    from infrarsi.study.contract import BackendSpec

    for value, completion in (("1", True), ("0", False)):
        settings = Settings.from_env({"INFRARSI_SLURM_SACCT_COMPLETION": value})
        backend = make_backend("slurm", tmp_path, BackendSpec(kind="slurm"), settings)
        assert backend._use_completion() is completion  # decided by the setting: scontrol is never asked
    with pytest.raises(SettingsError, match="INFRARSI_SLURM_SACCT_COMPLETION='maybe'"):
        Settings.from_env({"INFRARSI_SLURM_SACCT_COMPLETION": "maybe"})


def test_the_agent_endpoint_comes_from_the_contract_then_the_llm_settings(tmp_path: Path) -> None:
    from infrarsi.agent.client import AgentUnconfigured, resolve_endpoint
    from infrarsi.study.contract import AgentSpec

    key_file = tmp_path / "key"
    key_file.write_text("sk-from-file\n")
    env = {"INFRARSI_LLM_BASE_URL": "http://h:1/v1/", "INFRARSI_LLM_MODEL": "m", "INFRARSI_LLM_API_KEY_FILE": str(key_file)}
    endpoint = resolve_endpoint(AgentSpec(), env)
    assert (endpoint.base_url, endpoint.model, endpoint.api_key) == ("http://h:1/v1", "m", "sk-from-file")
    assert "sk-from-file" not in repr(Settings.from_env({**env, "INFRARSI_LLM_API_KEY": "sk-from-file"}))
    with pytest.raises(AgentUnconfigured, match="INFRARSI_LLM_MODEL"):
        resolve_endpoint(AgentSpec(), {"INFRARSI_LLM_BASE_URL": "http://h:1/v1"})
