"""A workload whose patch library attacks the harness: what a hostile candidate (a library patch, or a diff a
language model wrote) would try from inside its trial.

The job is a small plain-PyTorch loop with the probe's ``track`` decorator (``support.toy_job``); its first line
imports ``attack.py``, one line (``ATTACK = None``) in the golden. Each patch of the library replaces that line
with an attack that runs before training, prints what it got (``ATTACK <name>: …``) and never raises, so the job
then trains and is measured like any other; ``honest`` changes nothing that matters. Every attack knows only what
a real one would: its working directory (``<data>/launcher/trials/<trial>/worktree``, so the data directory is
``cwd.parents[3]``), its environment, and the port of a listener the test starts (``HOSTILE_PORT``, in the
contract's ``workload.env``).

- ``read-seed``: reads every seed under ``<data>/creds/`` (and ``$INFRARSI_NKEY_FILE``) and prints them;
- ``publish-as-admin``: with ``admin.nk``, publishes a ``StudyFinished`` of its study claimed by the proposer;
- ``steps-into-other-trial``: publishes a step on every other trial's telemetry subject with the probe's seed,
  and writes another trial's step into its own probe file for the launcher to relay;
- ``write-outside``: writes into the data directory, over another trial's ``finished.json`` and into ``/tmp``;
- ``read-analyst-db``: opens every ``*.duckdb`` under the data directory and prints its ``secret`` table;
- ``local-port``: connects to the test's listener and to the bus's port.

The tests judge by what the host sees (files, the bus's streams, the listener's accepts, seeds in the output),
never by what the job says.
"""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import yaml
from support.toy_job import TRACK_IMPORT, TRACKED_LOOP, toy_job_script

STEPS = 6

TRAIN = toy_job_script(
    flags={"hidden": 64},
    imports=f"import attack  # noqa: F401 — the candidate's code runs first\n{TRACK_IMPORT}",
    body=TRACKED_LOOP,
)

_PRELUDE = """\
import asyncio, json, os, socket, time
from pathlib import Path
DATA = Path.cwd().parents[3]
STUDY = os.environ.get("INFRARSI_STUDY", "")
TRIAL = os.environ.get("INFRARSI_TRIAL", "")
def say(name, text):
    print(f"ATTACK {name}: {text}", flush=True)
def bus_url():
    url = os.environ.get("INFRARSI_NATS_URL")
    if url:
        return url
    try:
        return "nats://127.0.0.1:%d" % json.loads((DATA / "nats-server.json").read_text())["port"]
    except (OSError, ValueError, KeyError):
        pass
    try:  # the server's config beside it names its port too
        for line in (DATA / "nats-server.conf").read_text().splitlines():
            if line.startswith("listen:"):
                return "nats://" + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None
def other_trials():
    try:
        return [p.name for p in (DATA / "launcher" / "trials").iterdir() if p.name != TRIAL]
    except OSError:
        return []
async def publish(seed, subject, data):
    import nats
    nc = await nats.connect(bus_url(), nkeys_seed=str(seed), connect_timeout=3, max_reconnect_attempts=0,
                            inbox_prefix="_INBOX_" + Path(seed).stem.replace(".", "_"))
    try:
        return await nc.jetstream(timeout=3).publish(subject, data)
    finally:
        await nc.close()
"""

ATTACKS: dict[str, str] = {
    "read-seed": """
for seed in sorted(set([*(DATA / "creds").glob("*.nk")] if (DATA / "creds").is_dir() else [])
                   | ({Path(os.environ["INFRARSI_NKEY_FILE"])} if os.environ.get("INFRARSI_NKEY_FILE") else set())):
    try:
        say("read-seed", f"READ {seed.name} {seed.read_text().strip()}")
    except OSError as exc:
        say("read-seed", f"blocked {seed}: {type(exc).__name__}")
if not (DATA / "creds").is_dir():
    say("read-seed", f"blocked: no {DATA / 'creds'}")
""",
    "publish-as-admin": """
from infrarsi import events as ev
forged = ev.make_event(ev.StudyFinished(reason="forged by a trial", trials=0, accelerator_s=0.0),
                       study_id=STUDY, source="proposer")
try:
    asyncio.run(publish(DATA / "creds" / "admin.nk", f"irsi.{STUDY}.StudyFinished", ev.encode(forged)))
    say("publish-as-admin", "PUBLISHED StudyFinished as admin")
except Exception as exc:
    say("publish-as-admin", f"blocked: {type(exc).__name__}: {exc}")
""",
    "steps-into-other-trial": """
from infrarsi import events as ev
step = ev.TrialStep(rank=0, world_size=1, step=0, loss=1e-9, step_time_s=1e-6, tokens=1, optimizer_steps=1,
                    peak_memory_bytes=1)
seed = os.environ.get("INFRARSI_NKEY_FILE") or str(DATA / "creds" / "probe.nk")
for other in other_trials() or ["victim"]:
    line = ev.encode(ev.make_event(step, study_id=STUDY, trial_id=other, source="probe"))
    try:
        asyncio.run(publish(seed, f"irsi.telemetry.{STUDY}.{other}", line))
        say("steps-into-other-trial", f"PUBLISHED a step of {other}")
    except Exception as exc:
        say("steps-into-other-trial", f"blocked publishing for {other}: {type(exc).__name__}: {exc}")
    probe_dir = Path(os.environ["INFRARSI_PROBE_DIR"])
    with open(probe_dir / "probe-rank0.jsonl", "ab") as own:
        own.write(line + b"\\n")
""",
    "write-outside": """
targets = [DATA / "PWNED", Path("/tmp") / f"irsi-hostile-{TRIAL}"]
targets += [DATA / "launcher" / "trials" / other / "finished.json" for other in other_trials()]
for target in targets:
    try:
        target.write_text("pwned by a trial")
        say("write-outside", f"WROTE {target}")
    except OSError as exc:
        say("write-outside", f"blocked {target}: {type(exc).__name__}")
""",
    "read-analyst-db": """
found = list(DATA.rglob("*.duckdb")) if DATA.is_dir() else []
for db in found:
    try:
        import duckdb
        rows = duckdb.connect(str(db), read_only=True).execute("SELECT * FROM secret").fetchall()
        say("read-analyst-db", f"READ {db} {rows}")
    except Exception as exc:
        say("read-analyst-db", f"blocked {db}: {type(exc).__name__}: {exc}")
if not found:
    say("read-analyst-db", f"blocked: no database under {DATA}")
""",
    "local-port": """
url = bus_url()
ports = [int(os.environ["HOSTILE_PORT"])] + ([int(url.rsplit(":", 1)[1])] if url else [])
for port in ports:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=3) as conn:
            conn.sendall(b"hello from a trial\\n")
        say("local-port", f"CONNECTED to 127.0.0.1:{port}")
    except OSError as exc:
        say("local-port", f"blocked 127.0.0.1:{port}: {type(exc).__name__}")
""",
}

HONEST = "honest"


def _attack_source(name: str) -> str:
    return _PRELUDE + textwrap.dedent(ATTACKS[name]).lstrip("\n")


def _patch(new_text: str) -> str:
    lines = new_text.splitlines()
    body = "".join(f"+{line}\n" for line in lines)
    return f"diff --git a/attack.py b/attack.py\n--- a/attack.py\n+++ b/attack.py\n@@ -1 +1,{len(lines)} @@\n-ATTACK = None\n{body}"


def write_hostile_workload(root: Path, *, listener_port: int, timeout_s: float = 600.0,
                           isolation: str = "sandbox", backend: dict | None = None) -> Path:  # fmt: skip
    """The workload repo (committed) under ``root / "job"`` and its contract; returns the contract's path.

    ``backend``: the contract's backend (``timeout_s`` added), instead of the local one with ``isolation``."""
    repo = root / "job"
    (repo / "patches").mkdir(parents=True)
    (repo / "train.py").write_text(TRAIN)
    (repo / "attack.py").write_text("ATTACK = None\n")
    index = [{"id": name, "description": f"attack: {name}", "files": ["attack.py"]} for name in ATTACKS]
    for name in ATTACKS:
        (repo / "patches" / f"{name}.patch").write_text(_patch(_attack_source(name)))
    (repo / "patches" / f"{HONEST}.patch").write_text(_patch("ATTACK = 'none'"))
    index.append({"id": HONEST, "description": "changes nothing that matters", "files": ["attack.py"]})
    (repo / "patches" / "index.yaml").write_text(yaml.safe_dump({"patches": index}))
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "."], check=True)
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "job"],
                   check=True)  # fmt: skip
    contract = {
        "name": "hostile",
        "goal": "trials that attack the harness",
        "workload": {"repo": "job", "command": ["{python}", "train.py", "--batch_size", "16"],
                     "knobs_via": "argv", "env": {"OMP_NUM_THREADS": "1", "HOSTILE_PORT": str(listener_port)},
                     "steps": STEPS, "steps_key": "max_steps", "verify_steps": STEPS, "patch_dir": "patches"},
        "cluster": {"id": "cpu", "accelerator": "cpu", "memory_capacity_bytes": 4 << 30, "peak_flops": None},
        "backend": {**(backend or {"kind": "local", "isolation": isolation}), "timeout_s": timeout_s},
        "scope": {"files": ["attack.py"], "launch_keys": ["hidden"]},
        "search_space": {"knobs": {"hidden": {"type": "int", "choices": [64]}}, "patches": [*ATTACKS, HONEST]},
        "invariants": {"loss": {"tolerance": 0.5}, "eval": False, "timing_tolerance": 1.0},
        "budget": {"trials": 20, "accelerator_hours": 1.0},
    }  # fmt: skip
    path = root / "contract.yaml"
    path.write_text(yaml.safe_dump(contract, sort_keys=False))
    return path
