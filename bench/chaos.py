"""Chaos: a simulator study while every service is SIGKILLed at random moments and the nats-server twice.

    python bench/chaos.py [--trials 60] [--kills 30] [--nats-kills 2] [--parallel 2] [--seed 0] [--json]

A real stack (embedded nats-server with JetStream on disk, the six service processes) runs a study on the
``sim`` backend (bench/sim_study.py). While it runs, a schedule built from ``--seed`` SIGKILLs one service
every 0.5–2 s (every service at least ``--kills``/6 and at least 3 times, in random order) and restarts it
as ``infrarsi up`` does (``Stack.restart``); at one third and two thirds of the schedule the nats-server
itself is SIGKILLed and restarted over the same store (on its old port). Once the study has finished, the
services are stopped and the log is read back with every stored message, duplicates included.

Prints trials proposed / finished / measured, trials lost (proposed, never finished), duplicates (messages
sharing an event id; trials finished or launched twice), and whether the reporter's analyst DB equals a fresh
replay of the streams, table by table. Exit 0 when nothing was lost or duplicated and the DBs are equal.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sim_study  # noqa: E402
from infrarsi.bus.client import Bus  # noqa: E402
from infrarsi.bus.credentials import ADMIN  # noqa: E402
from infrarsi.bus.embedded import EmbeddedServer  # noqa: E402
from infrarsi.eventlog import analyst_db_path  # noqa: E402
from infrarsi.runtime.stack import SERVICES, Stack  # noqa: E402

STUDY_ID = "01chaos0000000000000000000"


def kill_schedule(kills: int, rng: random.Random) -> list[str]:
    """``kills`` service names (at least 3 of each), shuffled."""
    per_service = max(3, -(-kills // len(SERVICES)))
    names = [name for name in SERVICES for _ in range(per_service)]
    rng.shuffle(names)
    return names


async def chaos(stack: Stack, schedule: list[str], nats_kills: int, rng: random.Random, done: asyncio.Event,
                log: list[dict]) -> None:  # fmt: skip
    """Kill and restart services (and the server at evenly spaced points) until the schedule or the study ends."""
    nats_at = {round(len(schedule) * (i + 1) / (nats_kills + 1)) for i in range(nats_kills)}
    for i, name in enumerate(schedule):
        if done.is_set():
            return
        await asyncio.sleep(rng.uniform(0.5, 2.0))
        if i in nats_at and stack.server is not None:
            stack.server.kill()
            log.append({"t": time.monotonic(), "killed": "nats-server"})
            await asyncio.sleep(rng.uniform(0.5, 1.5))
            stack.server = await asyncio.to_thread(EmbeddedServer.start, stack.data_dir)
        proc = stack.processes[name]
        if proc.alive():
            os.killpg(proc.pid, signal.SIGKILL)
            await asyncio.to_thread(proc.process.wait)
            log.append({"t": time.monotonic(), "killed": name, "during_study": not done.is_set()})
        await asyncio.sleep(rng.uniform(0.0, 0.5))
        await asyncio.to_thread(stack.restart, name)


async def measure(args: argparse.Namespace) -> dict:
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="irsi-chaos-") as tmp:
        root, data_dir = Path(tmp), Path(tmp) / "data"
        contract = sim_study.write_contract(root, trials=args.trials, parallel=args.parallel)
        env = {"INFRARSI_LAUNCHER_ACK_WAIT_S": "5", "INFRARSI_SIM_STEP_S": str(args.step_s)}
        stack = await asyncio.to_thread(Stack.start, data_dir, env=env)
        log: list[dict] = []
        started = time.monotonic()
        try:
            bus = await Bus.connect(stack.url, service=ADMIN, data_dir=data_dir)
            await sim_study.create_study(bus, contract, data_dir, STUDY_ID)
            done = asyncio.Event()
            monkey = asyncio.create_task(chaos(stack, kill_schedule(args.kills, rng), args.nats_kills, rng, done, log))
            finished = await sim_study.run_study(bus, STUDY_ID, trials=args.trials, parallel=args.parallel,
                                                 timeout_s=args.timeout)  # fmt: skip
            done.set()
            await monkey
            study_s = time.monotonic() - started
            await asyncio.sleep(3.0)  # let the last acks and the reporter's catch-up land
            server, stack.server = stack.server, None
            await asyncio.to_thread(stack.stop)  # services only: the reporter lets go of its DB
            events = await sim_study.lifecycle(bus, STUDY_ID)
            ledger = sim_study.study_ledger(events)
            replay = await sim_study.analyst_equals_replay(bus, analyst_db_path(data_dir))
            await bus.close()
            if server is not None:
                server.stop()
        finally:
            await asyncio.to_thread(stack.stop)
    kills = [k for k in log if k["killed"] != "nats-server"]
    per_service = {name: sum(1 for k in kills if k["killed"] == name) for name in SERVICES}
    return {
        "study_finished": finished is not None,
        "result": sim_study.result_of(finished, ledger),
        "study_s": round(study_s, 1),
        "service_kills": len(kills),
        "service_kills_during_study": sum(1 for k in kills if k.get("during_study")),
        "kills_per_service": per_service,
        "nats_kills": sum(1 for k in log if k["killed"] == "nats-server"),
        **ledger,
        "analyst_db_equals_replay": replay["equal"],
        "tables": replay["tables"],
        "rows": replay["rows"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=60)
    parser.add_argument("--kills", type=int, default=30)
    parser.add_argument("--nats-kills", type=int, default=2)
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--step-s", type=float, default=0.05, help="wall seconds per simulated step")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = sim_study.run_and_print(measure(args), as_json=args.json)
    ok = (result["study_finished"] and result["trials_lost"] == 0 and result["duplicate_event_ids"] == 0
          and result["trials_finished_twice"] == 0 and result["analyst_db_equals_replay"])  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
