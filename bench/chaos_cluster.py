"""Chaos on a 3-node JetStream cluster: a node killed and restarted, another partitioned and healed, mid-study.

    python bench/chaos_cluster.py [--trials 40] [--down-s 10] [--step-s 0.05] [--json]

Needs root (network namespaces). Three nats-servers of deploy/nats/secure/cluster (R3 streams,
``sync_interval: always``, TLS on routes and to clients, nkey authorization; bench/nats_cluster.py) run in
the namespaces ``irsi-c1..3`` on 10.214.0.0/24 (bridge ``irsicbr0``), created and removed by the run. The six
services run in the root namespace against all three nodes (``INFRARSI_NATS_URL`` as a comma list,
``INFRARSI_REPLICAS=3``) and drive a simulator study (bench/sim_study.py). Its course must not depend on the
host: one trial at a time, a re-run replays the draw of the trial it re-runs, and the timing check is loosened
to ``TIMING_TOLERANCE``. Faults, triggered by the study's progress rather than the clock:

1. after a quarter of the trials finished, the lifecycle stream's leader is SIGKILLed, left down ``--down-s``
   and restarted over its store;
2. after half, the current leader (another node than the killed one if it is that one) is partitioned away
   (its link on the bridge down: connections hang, nothing is refused) for ``--down-s`` and healed.

Every process that publishes through ``infrarsi.bus.client.Bus`` — the services, killed or not, and this script —
logs every ack it receives (``INFRARSI_ACK_JOURNAL``). Afterwards every acked message id is looked up in its
stream: an acked write missing from the stream is a lost event. The same study then runs on one embedded
server with no faults, and the two results are compared: the best candidate and the candidates sent to
verification; ``course_agrees_for`` says for how many search trials the two runs proposed the same candidates
and measured the same values. (The searcher also learns each trial's cost; the simulator reports its simulated
cost, not this host's wall time, so the course does not depend on the host's load.) The scenario is one whose
study promotes a candidate, so the comparison covers a verified winner, not only "nothing promotable".

Prints the faults, acks received / acked messages missing from their stream, trials proposed / finished /
measured / lost / duplicated, whether the analyst DB equals a fresh replay, and both study results. Exit 0 when
no acked event was lost, no trial lost or duplicated, and the result equals the single node's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import sim_study  # noqa: E402
from infrarsi.bus import credentials  # noqa: E402
from infrarsi.bus.client import STREAMS, AckJournal, Bus  # noqa: E402
from infrarsi.bus.subjects import LIFECYCLE_STREAM  # noqa: E402
from infrarsi.eventlog import analyst_db_path  # noqa: E402
from infrarsi.runtime.stack import Stack  # noqa: E402
from infrarsi.trial import netns
from nats.js import api  # noqa: E402
from nats_cluster import NODES, NatsCluster  # noqa: E402

STUDY_ID = "01chaos3node00000000000000"
PREFIX, BRIDGE, SUBNET = "irsi-c", "irsicbr0", "10.214.0.0/24"
"""Reserved for this benchmark on the shared host: created at the start of a run, removed at its end."""
TIMING_TOLERANCE = 0.5
"""The study's timing check, loosened: it tells a hack from host noise elsewhere (tests/unit/test_timing_invariant.py);
here a verdict flipped by this shared host's load would only add that noise to the comparison of the two runs."""
COMPARED = ("best_candidate_key", "verify_requested", "verdicts")
"""The study's result: its best verified candidate, the candidates it sent to verification (as a set) and each
one's verdict (promotable or not)."""
SCENARIO = "dense7b_h200x64"
"""A scenario whose study promotes a candidate at this budget (on dense7b_h100x64 the fastest candidates use
FP8, which breaks the loss there: nothing was promoted in either run, and "the same result" was a weak check)."""


async def connect_admin(url: str, data_dir: Path, acks: Path, timeout_s: float = 60.0) -> Bus:
    """The bench's own connection (R3 streams), once the cluster has a meta leader to create them."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await Bus.connect(url, service=credentials.ADMIN, data_dir=data_dir, replicas=3, ack_journal=acks)
        except Exception:  # noqa: BLE001 — "no meta leader" / "insufficient resources" while the nodes elect
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(1.0)


async def stream_leader(bus: Bus) -> str:
    """The node leading the lifecycle stream (asked again while an election is under way)."""
    for _ in range(60):
        try:
            info = await bus.js.stream_info(LIFECYCLE_STREAM)
            if info.cluster is not None and info.cluster.leader:
                return info.cluster.leader
        except Exception:  # noqa: BLE001 — no leader yet, or the request timed out across the change
            pass
        await asyncio.sleep(1.0)
    raise RuntimeError("the lifecycle stream has had no leader for a minute")


async def finished_trials(bus: Bus) -> int:
    events = await sim_study.lifecycle(bus, STUDY_ID)
    return sim_study.study_ledger(events)["trials_finished"]


async def until_finished(bus: Bus, count: int, done: asyncio.Event) -> bool:
    """Wait until ``count`` trials finished (``False`` if the study ended first)."""
    while not done.is_set():
        try:
            if await finished_trials(bus) >= count:
                return True
        except Exception:  # noqa: BLE001 — a read across a leader change; ask again
            pass
        await asyncio.sleep(2.0)
    return False


async def faults(cluster: NatsCluster, bus: Bus, args: argparse.Namespace, done: asyncio.Event,
                 log: list[dict]) -> None:  # fmt: skip
    t0 = time.monotonic()

    def note(what: str, node: str) -> None:
        log.append({"t_s": round(time.monotonic() - t0, 1), "fault": what, "node": node})

    if not await until_finished(bus, max(1, args.trials // 4), done):
        return
    killed = await stream_leader(bus)
    cluster.kill(killed)
    note("killed (SIGKILL), stream leader", killed)
    await asyncio.sleep(args.down_s)
    await asyncio.to_thread(cluster.start, killed)
    note("restarted, healthy", killed)

    if not await until_finished(bus, max(2, args.trials // 2), done):
        return
    leader = await stream_leader(bus)
    cut = leader if leader != killed else next(n for n in NODES if n != killed)
    cluster.partition(cut)
    note("partitioned" + (", stream leader" if cut == leader else ""), cut)
    await asyncio.sleep(args.down_s)
    cluster.heal(cut)
    note("healed", cut)
    await asyncio.to_thread(cluster.wait_healthy, cut)
    note("healthy", cut)


async def stored_ids(bus: Bus) -> dict[str, set[str]]:
    """Per stream, the ``Nats-Msg-Id`` of every stored message (a pull consumer of nats-py's: the headers are
    what this needs, and ``bus.reader`` hands out sequence, subject and data only)."""
    out: dict[str, set[str]] = {}
    for spec in STREAMS:
        ids: set[str] = set()
        config = api.ConsumerConfig(ack_policy=api.AckPolicy.NONE, inactive_threshold=30.0, max_ack_pending=-1)
        sub = await bus.js.pull_subscribe("", stream=spec.name, config=config)
        try:
            remaining = (await sub.consumer_info()).num_pending or 0
            while remaining > 0:
                batch = await sub.fetch(min(1024, remaining), timeout=5.0)
                remaining -= len(batch)
                ids.update(msg.headers.get("Nats-Msg-Id", "") for msg in batch if msg.headers)
        except TimeoutError:
            pass
        finally:
            await sub.unsubscribe()
        out[spec.name] = ids
    return out


async def cluster_run(root: Path, args: argparse.Namespace, contract: Path) -> dict:
    data_dir, acks = root / "data", root / "acks"
    with netns.NetnsNetwork(PREFIX, BRIDGE, SUBNET, hosts=len(NODES)) as net:
        cluster = NatsCluster(root / "nats", net, data_dir)
        try:
            for name in NODES:
                cluster.start(name, wait=False)
            for name in NODES:
                await asyncio.to_thread(cluster.wait_healthy, name)
            # The services and this script reach the nodes over TLS (the test CA) with R3 streams.
            os.environ[credentials.TLS_CA_ENV] = str(cluster.ca_file)
            env = {"INFRARSI_REPLICAS": "3", "INFRARSI_ACK_JOURNAL": str(acks), "INFRARSI_LAUNCHER_ACK_WAIT_S": "5",
                   "INFRARSI_SIM_STEP_S": str(args.step_s)}  # fmt: skip
            bus = await connect_admin(cluster.url, data_dir, acks)
            stack = await asyncio.to_thread(Stack.start, data_dir, nats_url=cluster.url, env=env)
            log: list[dict] = []
            try:
                await sim_study.create_study(bus, contract, data_dir, STUDY_ID)
                done = asyncio.Event()
                started = time.monotonic()
                monkey = asyncio.create_task(faults(cluster, bus, args, done, log))
                finished = await sim_study.run_study(bus, STUDY_ID, trials=args.trials, parallel=1,
                                                     timeout_s=args.timeout)  # fmt: skip
                study_s = time.monotonic() - started
                done.set()
                await monkey
                await asyncio.sleep(3.0)  # the last acks and the reporter's catch-up
            finally:
                await asyncio.to_thread(stack.stop)
            journal = AckJournal.read(acks)
            stored = await stored_ids(bus)
            events = await sim_study.lifecycle(bus, STUDY_ID)
            ledger = sim_study.study_ledger(events)
            replay = await sim_study.analyst_equals_replay(bus, analyst_db_path(data_dir))
            await bus.close()
        finally:
            await asyncio.to_thread(cluster.stop)
    lost = sorted({(stream, msg_id) for stream, _seq, msg_id in journal if msg_id not in stored.get(stream, set())})
    return {
        "study_finished": finished is not None,
        "study_s": round(study_s, 1),
        "faults": log,
        "acks_received": len(journal),
        "acked_messages": len({(stream, msg_id) for stream, _seq, msg_id in journal}),
        "acked_by_stream": {s.name: sum(1 for stream, _, _ in journal if stream == s.name) for s in STREAMS},
        "acked_lost": len(lost),
        "acked_lost_examples": [f"{s} {m}" for s, m in lost[:5]],
        **ledger,
        "analyst_db_equals_replay": replay["equal"],
        "result": sim_study.result_of(finished, ledger, events),
    }


async def measure(args: argparse.Namespace) -> dict:
    reason = netns.unavailable_reason()
    if reason is not None:
        raise SystemExit(f"chaos_cluster: {reason}")
    with tempfile.TemporaryDirectory(prefix="irsi-chaos3-") as tmp:
        root = Path(tmp)
        contract = sim_study.write_contract(root / "cluster", trials=args.trials, parallel=1, scenario=SCENARIO,
                                            timing_tolerance=TIMING_TOLERANCE)  # fmt: skip
        result = await cluster_run(root / "cluster", args, contract)
        # The same workload written again (its own repo: the study id's golden tag is taken in the first).
        twin = sim_study.write_contract(root / "single", trials=args.trials, parallel=1, scenario=SCENARIO,
                                        timing_tolerance=TIMING_TOLERANCE)  # fmt: skip
        env = {"INFRARSI_SIM_STEP_S": str(args.step_s)}
        result["single_node_result"] = await sim_study.reference_result(root / "single" / "data", twin, STUDY_ID,
                                                                        trials=args.trials, timeout_s=args.timeout,
                                                                        env=env)  # fmt: skip
    one, three = result["single_node_result"], result["result"]
    result["same_result_as_single_node"] = one is not None and three is not None and all(
        _comparable(one[k]) == _comparable(three[k]) for k in COMPARED)
    result["promoted_in_both"] = one is not None and three is not None and None not in (
        one["best_candidate_key"], three["best_candidate_key"])
    if one is not None and three is not None:
        courses = course(three["search_measured"]), course(one["search_measured"])
        result["course_agrees_for"] = next((i for i, (a, b) in enumerate(zip(*courses, strict=False)) if a != b),
                                           min(map(len, courses)))  # fmt: skip
    return result


def _comparable(value: object) -> object:
    return sorted(value) if isinstance(value, list) else value


def course(measured: list[list]) -> list[list]:
    """The search trials as the models learnt them: a re-run (it follows its trial: one trial at a time) stands
    in for the trial it repeats, whose verdict was the host's (interference) or the harness's."""
    out: list[list] = []
    for *row, rerun in measured:
        if rerun and out and out[-1][0] == row[0]:
            out[-1] = row
        else:
            out.append(row)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--down-s", type=float, default=10.0, help="how long the killed node stays down, and the "
                        "partition lasts")  # fmt: skip
    parser.add_argument("--step-s", type=float, default=0.05, help="wall seconds per simulated step")
    parser.add_argument("--timeout", type=float, default=1800.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = sim_study.run_and_print(measure(args), as_json=args.json)
    ok = (result["study_finished"] and result["acked_lost"] == 0 and result["trials_lost"] == 0
          and result["duplicate_event_ids"] == 0 and result["trials_finished_twice"] == 0
          and result["same_result_as_single_node"])  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
