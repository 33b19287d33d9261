"""docker-compose.yml, the Dockerfile and deploy/nats: the structure the deployment relies on, and every
NATS configuration accepted by the real ``nats-server -t`` (config test)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml
from infrarsi.bus.embedded import nats_server_binary
from infrarsi.runtime.stack import SERVICES

ROOT = Path(__file__).resolve().parents[2]
NATS_DIR = ROOT / "deploy" / "nats"


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_compose_runs_nats_and_the_six_services(compose: dict) -> None:
    services = compose["services"]
    assert set(services) == {"nats", *SERVICES}
    for name in SERVICES:
        svc = services[name]
        assert svc["command"] == ["infrarsi", "serve", name]
        assert svc["environment"]["INFRARSI_NATS_URL"] == "nats://nats:4222"
        assert svc["depends_on"] == {"nats": {"condition": "service_healthy"}}
        assert svc["restart"] == "unless-stopped"
        assert svc["build"] == "." and svc["image"] == services[SERVICES[0]]["image"], "one image for all six"


def test_compose_nats_is_jetstream_with_a_volume_and_a_healthcheck(compose: dict) -> None:
    nats = compose["services"]["nats"]
    assert nats["image"].startswith("nats:2.12")
    command = nats["command"]
    assert "-js" in command
    assert command[command.index("-sd") + 1] == "/data"
    config_in_container = command[command.index("-c") + 1]
    mounts = {m.split(":")[1]: m.split(":")[0] for m in nats["volumes"]}
    assert (ROOT / mounts[config_in_container]).resolve() == NATS_DIR / "single.conf"
    assert mounts["/data"] in compose["volumes"], "the JetStream store must be a named volume"
    probe = " ".join(nats["healthcheck"]["test"])
    assert ":8222/healthz" in probe


def test_dockerfile_builds_the_project_on_python_311_with_cpu_torch() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert dockerfile.startswith("#") and "FROM python:3.11-slim" in dockerfile
    assert "torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in dockerfile
    assert "pip install -e ." in dockerfile
    pinned = next(d for d in _pyproject_dependencies() if d.startswith("torch=="))
    assert pinned == "torch==2.13.0", "keep the Dockerfile's torch pin equal to pyproject.toml's"


def _pyproject_dependencies() -> list[str]:
    import tomllib

    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]


NATS_CONFIGS = ["single.conf", "cluster/n1.conf", "cluster/n2.conf", "cluster/n3.conf"]


@pytest.mark.parametrize("name", NATS_CONFIGS)
def test_nats_config_is_accepted_by_nats_server(name: str) -> None:
    result = subprocess.run(
        [str(nats_server_binary()), "-c", str(NATS_DIR / name), "-t"], capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr or result.stdout


def _conf_value(text: str, key: str) -> str | None:
    for line in text.splitlines():
        stripped = line.split("#", 1)[0].strip()
        if stripped.startswith(f"{key}:"):
            return stripped.split(":", 1)[1].strip().strip('"')
    return None


def test_cluster_nodes_fsync_every_write_and_route_to_each_other() -> None:
    names = set()
    for i in (1, 2, 3):
        text = (NATS_DIR / "cluster" / f"n{i}.conf").read_text()
        assert _conf_value(text, "sync_interval") == "always", f"n{i}: acknowledged writes must be fsynced"
        assert _conf_value(text, "name") == "infrarsi", "one cluster name"
        names.add(_conf_value(text, "server_name"))
        for j in (1, 2, 3):
            assert f"nats-route://n{j}:6222" in text
    assert names == {"n1", "n2", "n3"}


def test_nats_config_test_flag_catches_a_broken_config(tmp_path: Path) -> None:
    # The check above must be able to fail: a misspelt JetStream option is rejected.
    broken = tmp_path / "broken.conf"
    broken.write_text((NATS_DIR / "cluster" / "n1.conf").read_text().replace("sync_interval", "sync_intervall"))
    result = subprocess.run([str(nats_server_binary()), "-c", str(broken), "-t"], capture_output=True, timeout=30)
    assert result.returncode != 0
