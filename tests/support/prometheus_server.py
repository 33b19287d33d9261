"""A real Prometheus server (Debian's ``prometheus`` package) scraping a stack's services, for the metrics test.

``install_reason`` installs the package with apt-get when the binary is missing (as the Slurm fixture does; ``make
prometheus-deps`` does the same up front) and says why not when it cannot. ``PrometheusServer`` writes a scrape
config from ``deploy/prometheus/prometheus.yml`` pointed at the stack's file-service-discovery targets
(``<data_dir>/metrics/*.json``), starts the server on a free loopback port with its own storage, and queries it
through its HTTP API. Nothing here is a stand-in: the values come back from Prometheus's own scrapes.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import yaml
from support import apt

PACKAGES = ("prometheus",)
REPO = Path(__file__).resolve().parents[2]
SCRAPE_CONFIG = REPO / "deploy" / "prometheus" / "prometheus.yml"


def install_reason() -> str | None:
    """Install Prometheus with apt-get when missing; ``None`` when it is there, else why not."""
    if (reason := apt.install_reason("prometheus", PACKAGES, ("prometheus",))) is not None:
        return reason
    return None if shutil.which("prometheus") else "apt-get installed prometheus but it is not on PATH"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrometheusServer:
    """``prometheus`` scraping ``<data_dir>/metrics/*.json`` every second; ``stop()`` leaves nothing running."""

    def __init__(self, root: Path, data_dir: Path) -> None:
        config = yaml.safe_load(SCRAPE_CONFIG.read_text())
        config["global"]["scrape_interval"] = config["global"]["evaluation_interval"] = "1s"
        job = config["scrape_configs"][0]
        job["file_sd_configs"] = [{"files": [str(data_dir / "metrics" / "*.json")], "refresh_interval": "1s"}]
        root.mkdir(parents=True, exist_ok=True)
        (root / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(root / "prometheus.log", "wb")  # noqa: SIM115 — closed in stop()
        self.process = subprocess.Popen(
            ["prometheus", f"--config.file={root / 'prometheus.yml'}", f"--storage.tsdb.path={root / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        self.root = root

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"prometheus exited: {(self.root / 'prometheus.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.3)
        raise AssertionError("prometheus did not become ready")

    def query(self, promql: str) -> list[dict]:
        """The instant vector of ``promql``: ``[{"metric": {...}, "value": [ts, "v"]}, ...]``."""
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
        with urllib.request.urlopen(url, timeout=10) as reply:
            body = json.loads(reply.read())
        assert body["status"] == "success", body
        return list(body["data"]["result"])

    def targets(self) -> list[dict]:
        with urllib.request.urlopen(f"{self.url}/api/v1/targets", timeout=10) as reply:
            return list(json.loads(reply.read())["data"]["activeTargets"])

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.log.close()
