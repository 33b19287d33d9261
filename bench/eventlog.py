"""Benchmark: how fast ``infrarsi replay`` rebuilds the analyst DuckDB compared with raw consumption.

Starts a fresh embedded nats-server in a temporary directory, publishes ``--events`` realistic events
(~90 % ``TrialStep`` telemetry spread over many trials, the rest the lifecycle around them), then, in one
run, measures

- raw consumption with nats-py, every message of the three streams, counting only, two ways: nats-py's own
  ordered push consumer (``js.subscribe(ordered_consumer=True)``) and its pull consumer (``fetch``, 4,096
  at a time). ``raw_consume_events_per_s`` is the faster of the two: the best a plain nats-py reader does;
- ``replay_reader_events_per_s``: ``bus.reader.read_stream`` counting only (the reader replay uses: its own
  minimal connection parsing a push consumer's deliveries in bulk, faster than nats-py), so
  ``replay_over_reader`` says what decoding and writing cost on top of reading;
- ``stages_without_nats``: the same log read into memory, then the replay's decode, DuckDB writes and final
  checkpoint timed one by one, and DuckDB's floor (the decoded log written in one batch per stream, plus
  the checkpoint): what the analyst DB costs before any message is read;
- ``replay_events_per_s``: ``eventlog.replay`` into a new DuckDB file (decode, validate, project, commit,
  final checkpoint).

Each measurement is repeated (``--repeat``) and the best kept: the figures are throughput on an idle
moment of the machine; CPU seconds and the load average are recorded beside them.

    .venv/bin/python bench/eventlog.py --events 100000 --json OUT.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

from infrarsi import eventlog
from infrarsi import events as ev
from infrarsi.bus.client import STREAMS, Bus
from infrarsi.bus.embedded import EmbeddedServer
from infrarsi.bus.reader import read_stream
from nats.js import api

PHASES = ("data", "forward", "backward", "optimizer", "comm")
KNOBS = {
    "micro_batch": [1, 2, 4, 8],
    "activation_checkpointing": [True, False],
    "autocast_dtype": ["bfloat16", "float32"],
    "zero_stage": [0, 1, 2, 3],
    "compile": [True, False],
}
PATCHES = ["fused-qkv", "flash-attn", "fused-adamw", "overlap-grad-reduce"]


class _Clock:
    """Deterministic timestamps: a synthetic log must not depend on the wall clock."""

    def __init__(self) -> None:
        self.now = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)

    def tick(self, seconds: float) -> datetime:
        self.now += timedelta(seconds=seconds)
        return self.now


def _event(payload: ev.Payload, clock: _Clock, rng: random.Random, *, study_id: str, source: str,
           trial_id: str | None = None, dt: float = 0.01) -> ev.Event:
    return ev.Event(
        event_id=f"{rng.getrandbits(128):032x}"[:26],
        type=type(payload).__name__,
        study_id=study_id,
        trial_id=trial_id,
        cluster_id="bench-h100",
        source=source,
        ts=clock.tick(dt),
        payload=payload,
    )


def synthetic_log(n_events: int, seed: int = 7, steps_per_trial: int = 12, ranks: int = 4) -> list[ev.Event]:
    """``n_events`` events of studies with baseline/search trials, their step telemetry and outcomes."""
    rng = random.Random(seed)
    clock = _Clock()
    out: list[ev.Event] = []
    study_no = 0
    while len(out) < n_events:
        study_no += 1
        study_id = f"study{study_no:04d}"
        cluster = ev.ClusterInfo(cluster_id="bench-h100", accelerator="H100-80G", nodes=1, devices_per_node=ranks,
                                 memory_capacity_bytes=80 * 2**30, peak_flops=989e12, interconnect="nvlink")
        out.append(_event(ev.StudyCreated(
            name=f"llama-{study_no}", goal="minimise step time", contract={"objective": "step_time", "budget": 40},
            contract_sha256=f"{rng.getrandbits(256):064x}", workload_dir="/work/workloads/llama",
            baseline_ref=f"{rng.getrandbits(160):040x}", locked_files={"train.py": f"{rng.getrandbits(256):064x}"},
            cluster=cluster), clock, rng, study_id=study_id, source="cli"))
        base_step = rng.uniform(0.3, 1.2)
        for trial_no in range(12):
            if len(out) >= n_events:
                break
            trial_id = f"{study_id}t{trial_no:03d}"
            knobs = {k: rng.choice(v) for k, v in KNOBS.items() if rng.random() < 0.6}
            patches = sorted(rng.sample(PATCHES, rng.randint(0, 2)))
            candidate = ev.Candidate(knobs=knobs, patches=patches)
            kind = "baseline" if trial_no == 0 else "search"
            out.append(_event(ev.TrialProposed(
                candidate=candidate, candidate_key=candidate.key(), kind=kind,
                origin="baseline" if trial_no == 0 else rng.choice(["seed", "prior", "ei"]),
                reason="expected improvement", prediction=ev.Prediction(step_time_s=base_step * 0.9,
                                                                         step_time_std_log=0.1)),
                clock, rng, study_id=study_id, trial_id=trial_id, source="proposer"))
            out.append(_event(ev.TrialLaunched(
                backend="local", workdir=f"/tmp/trials/{trial_id}", command=["torchrun", "train.py"], nodes=1,
                ranks=ranks, host="node-0", job_id=f"job-{trial_no}"),
                clock, rng, study_id=study_id, trial_id=trial_id, source="launcher"))
            speed = base_step * rng.uniform(0.7, 1.1)
            status = "oom" if rng.random() < 0.1 else "ok"
            steps = steps_per_trial if status == "ok" else steps_per_trial // 4
            loss_curve = []
            for step in range(1, steps + 1):
                loss = 2.0 + 8.5 * math.exp(-step / 60) + rng.gauss(0, 0.03)
                if step % 10 == 0:
                    loss_curve.append(ev.LossPoint(step, loss))
                for rank in range(ranks):
                    if len(out) >= n_events:
                        break
                    step_time = speed * (1.8 if step <= 3 else 1.0) * rng.lognormvariate(0, 0.03)
                    phases = {p: step_time * f for p, f in zip(PHASES, (0.05, 0.3, 0.5, 0.1, 0.05), strict=True)}
                    out.append(_event(ev.TrialStep(
                        rank=rank, world_size=ranks, step=step, loss=loss, step_time_s=step_time, phases=phases,
                        tokens=8 * 4096 * ranks, optimizer_steps=step, loss_tokens=8 * 4096 * ranks,
                        peak_memory_bytes=int(41e9 + rng.uniform(0, 1e9)), flops=3.2e14, mfu=0.41,
                        eval_loss=loss + 0.05 if step % 50 == 0 else None,
                        eval_tokens=65536 if step % 50 == 0 else None, wall_time=clock.now.timestamp()),
                        clock, rng, study_id=study_id, trial_id=trial_id, source="probe", dt=step_time / ranks))
            if len(out) >= n_events:
                break
            out.append(_event(ev.TrialFinished(
                status=status, reason="CUDA out of memory" if status == "oom" else "", exit_code=0 if status == "ok" else 1,
                wall_s=steps * speed + 20, ranks=ranks, accelerator_s=ranks * (steps * speed + 20),
                peak_memory_bytes=int(60e9), censored_peak_bytes=int(79e9) if status == "oom" else None,
                memory_capacity_bytes=80 * 2**30, steps_completed=steps,
                step_seen_s=[10 + i * speed for i in range(min(steps, 20))]),
                clock, rng, study_id=study_id, trial_id=trial_id, source="launcher"))
            if status == "ok":
                invariants = [ev.InvariantResult(name="loss", ok=True, detail="within band", observed=2.1,
                                                 expected=2.1, tolerance=0.05),
                              ev.InvariantResult(name="work.tokens", ok=True, detail="equal")]
                out.append(_event(ev.TrialMeasured(
                    candidate_key=candidate.key(), kind=kind, status="ok", steps=steps, warmup_steps=3,
                    step_time_s=speed, step_time_mad_s=speed * 0.02, step_time_with_warmup_s=speed * 1.01,
                    tokens_per_s=8 * 4096 * ranks / speed, mfu=0.41, flops_per_step=3.2e14,
                    phases={p: speed * f for p, f in zip(PHASES, (0.05, 0.3, 0.5, 0.1, 0.05), strict=True)},
                    peak_memory_bytes=[int(41e9)] * ranks, per_rank_step_s=[speed] * ranks, stragglers=[],
                    loss_curve=loss_curve, eval_curve=loss_curve[::5], optimizer_steps=steps,
                    tokens=steps * 8 * 4096 * ranks, invariants=invariants, invariants_ok=True,
                    accelerator_s=ranks * steps * speed),
                    clock, rng, study_id=study_id, trial_id=trial_id, source="telemetry"))
                effects = [ev.Effect(feature=f"patch:{p}", prior_mean=-0.05, prior_std=0.1,
                                     post_mean=rng.gauss(-0.05, 0.02), post_std=0.03) for p in PATCHES]
                out.append(_event(ev.ModelUpdated(
                    n_trials=trial_no + 1, n_oom=0, fit_seconds=0.2, noise_std_log=0.03, time_effects=effects,
                    memory_effects=effects[:2], best_candidate_key=candidate.key(), best_predicted_step_s=speed,
                    diagnostics={"r2": 0.8}), clock, rng, study_id=study_id, source="modeler"))
        if len(out) < n_events:
            out.append(_event(ev.StudyFinished(reason="budget", trials=12, accelerator_s=1e4),
                              clock, rng, study_id=study_id, source="proposer"))
    return out[:n_events]


# --------------------------------------------------------------------------------------------------
# Measurements
# --------------------------------------------------------------------------------------------------


async def _stream_totals(bus: Bus) -> dict[str, int]:
    counts = await bus.stream_counts()
    return {name: c["messages"] for name, c in counts.items() if c["messages"]}


async def raw_read_stream(bus: Bus) -> int:
    n = 0
    for stream in (await _stream_totals(bus)):
        async for chunk in read_stream(bus, stream):
            n += len(chunk)
    return n


async def raw_pull_fetch(bus: Bus) -> int:
    """nats-py's pull consumer: ``fetch`` of up to 4,096 messages at a time, no acks."""
    n = 0
    for stream, total in (await _stream_totals(bus)).items():
        config = api.ConsumerConfig(ack_policy=api.AckPolicy.NONE, inactive_threshold=30.0, max_ack_pending=-1)
        sub = await bus.js.pull_subscribe("", stream=stream, config=config)
        read = 0
        while read < total:
            read += len(await sub.fetch(min(4096, total - read), timeout=5.0))
        await sub.unsubscribe()
        n += read
    return n


async def raw_ordered_consumer(bus: Bus) -> int:
    n = 0
    for stream, total in (await _stream_totals(bus)).items():
        done = asyncio.Event()
        count = 0

        async def on_message(msg, total=total, done=done) -> None:
            nonlocal count
            count += 1
            if count >= total:
                done.set()

        spec = next(s for s in STREAMS if s.name == stream)
        subject = spec.subjects[0]
        count = 0
        sub = await bus.js.subscribe(subject, stream=stream, ordered_consumer=True, cb=on_message,
                                     pending_msgs_limit=-1, pending_bytes_limit=-1)
        await done.wait()
        await sub.unsubscribe()
        n += count
    return n


async def _timed(fn, *args) -> dict[str, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    n = await fn(*args)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"events": n, "seconds": round(wall, 4), "cpu_seconds": round(cpu, 4), "events_per_s": round(n / wall, 1)}


class _Stopwatch:
    """Wall and CPU seconds summed over the ``with`` blocks it timed."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0

    @contextlib.contextmanager
    def timing(self) -> Iterator[None]:
        cpu, wall = time.process_time(), time.perf_counter()
        try:
            yield
        finally:
            self.wall += time.perf_counter() - wall
            self.cpu += time.process_time() - cpu


async def stage_costs(bus: Bus, workdir: Path, repeat: int) -> dict:
    """Where a replay's time goes, without NATS: the log read into memory once, then per round the replay's
    decode (validate + stage, ``eventlog.decode_batch``) and DuckDB write (``write_batch``) of every batch of
    ``eventlog.DEFAULT_BATCH`` in turn, and the final checkpoint, each timed on its own (wall and CPU); and
    DuckDB's own floor: the already-decoded log written as one batch per stream (one transaction each, the
    cheapest way to hand DuckDB these rows) plus the checkpoint. The best round of each is kept."""
    msgs = {}
    for stream in await _stream_totals(bus):
        msgs[stream] = [m async for chunk in read_stream(bus, stream) for m in chunk]
    n = sum(len(v) for v in msgs.values())
    rounds = []
    for attempt in range(repeat):
        decode, write, checkpoint, floor = _Stopwatch(), _Stopwatch(), _Stopwatch(), _Stopwatch()
        db = eventlog.AnalystDB.open(workdir / f"stages-{attempt}.duckdb")
        try:
            for stream, ms in msgs.items():
                for k in range(0, len(ms), eventlog.DEFAULT_BATCH):
                    with decode.timing():
                        batch = eventlog.decode_batch(stream, ms[k:k + eventlog.DEFAULT_BATCH])
                    with write.timing():
                        db.write_batch(batch)
            with checkpoint.timing():
                db.checkpoint()
        finally:
            db.close()
        whole = [eventlog.decode_batch(stream, ms) for stream, ms in msgs.items()]
        floor_db = eventlog.AnalystDB.open(workdir / f"stages-floor-{attempt}.duckdb")
        try:
            with floor.timing():
                for batch in whole:
                    floor_db.write_batch(batch)
                floor_db.checkpoint()
        finally:
            floor_db.close()
        del whole, batch
        r = {"decode_s": decode.wall, "decode_cpu_s": decode.cpu, "write_s": write.wall, "write_cpu_s": write.cpu,
             "checkpoint_s": checkpoint.wall, "checkpoint_cpu_s": checkpoint.cpu, "duckdb_floor_s": floor.wall,
             "duckdb_floor_cpu_s": floor.cpu}
        rounds.append(r)
        print(f"  stages {attempt + 1}: decode {r['decode_s']:.2f}s, write {r['write_s']:.2f}s, checkpoint "
              f"{r['checkpoint_s']:.2f}s (no NATS: {n / (r['decode_s'] + r['write_s'] + r['checkpoint_s']):,.0f}/s "
              f"in sequence); DuckDB floor {r['duckdb_floor_s']:.2f}s = {n / r['duckdb_floor_s']:,.0f}/s",
              file=sys.stderr)
    best: dict = {key: round(min(r[key] for r in rounds), 4) for key in rounds[0]}
    best["events"] = n
    best["decode_write_checkpoint_events_per_s"] = round(
        n / (best["decode_s"] + best["write_s"] + best["checkpoint_s"]), 1)
    best["duckdb_floor_events_per_s"] = round(n / best["duckdb_floor_s"], 1)
    return best


async def run_bench(n_events: int, repeat: int, workdir: Path) -> dict:
    log = synthetic_log(n_events)
    steps = sum(1 for e in log if e.type == "TrialStep")
    with EmbeddedServer.start(workdir / "nats") as server:
        bus = await Bus.connect(server.url, service="bench")
        try:
            started = time.perf_counter()
            for i in range(0, len(log), 5000):
                await bus.publish_many(log[i:i + 5000], timeout_s=120.0)
            publish_s = time.perf_counter() - started
            # The measured readers must not share their process with 100k live Python objects they never
            # made: every cyclic collection would traverse them (a cost no real replay or consumer has).
            del log
            gc.collect()
            print(f"published {n_events:,} events ({steps / n_events:.0%} TrialStep) in {publish_s:.1f}s", file=sys.stderr)
            raw: dict[str, list[dict]] = {"pull_fetch": [], "ordered_consumer": []}
            reader: list[dict] = []
            replays: list[dict] = []
            for attempt in range(repeat):
                reader.append(await _timed(raw_read_stream, bus))
                raw["pull_fetch"].append(await _timed(raw_pull_fetch, bus))
                raw["ordered_consumer"].append(await _timed(raw_ordered_consumer, bus))
                db_path = workdir / f"replay-{attempt}.duckdb"
                cpu = time.process_time()
                stats = await eventlog.replay(bus, db_path, from_scratch=True)
                replays.append({"events": stats.events, "seconds": round(stats.seconds, 4),
                                "cpu_seconds": round(time.process_time() - cpu, 4),
                                "events_per_s": round(stats.events_per_s, 1)})
                print(f"  round {attempt + 1}: replay {stats.events_per_s:,.0f}/s; replay's reader alone "
                      f"{reader[-1]['events_per_s']:,.0f}/s; raw nats-py "
                      + ", ".join(f"{k} {v[-1]['events_per_s']:,.0f}/s" for k, v in raw.items()), file=sys.stderr)
            stages = await stage_costs(bus, workdir, repeat)
        finally:
            await bus.close()
    best_raw = {k: max(v, key=lambda r: r["events_per_s"]) for k, v in raw.items()}
    raw_method, raw_best = max(best_raw.items(), key=lambda kv: kv[1]["events_per_s"])
    replay_best = max(replays, key=lambda r: r["events_per_s"])
    reader_best = max(reader, key=lambda r: r["events_per_s"])
    assert replay_best["events"] == n_events, replay_best
    return {
        "events": n_events,
        "trial_step_fraction": round(steps / n_events, 4),
        "raw_consume_events_per_s": raw_best["events_per_s"],
        "raw_consume_method": raw_method,
        "replay_events_per_s": replay_best["events_per_s"],
        "replay_over_raw": round(replay_best["events_per_s"] / raw_best["events_per_s"], 3),
        "replay_cpu_seconds": replay_best["cpu_seconds"],
        "replay_reader_events_per_s": reader_best["events_per_s"],
        "replay_over_reader": round(replay_best["events_per_s"] / reader_best["events_per_s"], 3),
        "raw_best_by_method": best_raw,
        "replay_rounds": replays,
        "raw_rounds": raw,
        "replay_reader_rounds": reader,
        "stages_without_nats": stages,
        "publish_seconds": round(publish_s, 2),
        "load_average_after": list(__import__("os").getloadavg()),
        "cpu_count": __import__("os").cpu_count(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3, help="rounds of every measurement; the best is kept")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="infrarsi-bench-") as tmp:
        result = asyncio.run(run_bench(args.events, args.repeat, Path(tmp)))
    text = json.dumps(result, indent=2)
    if args.json:
        args.json.write_text(text + "\n")
    print(
        f"events={result['events']:,}  raw={result['raw_consume_events_per_s']:,.0f}/s ({result['raw_consume_method']})"
        f"  replay={result['replay_events_per_s']:,.0f}/s  replay/raw={result['replay_over_raw']:.2f}"
        f"  (replay's reader alone {result['replay_reader_events_per_s']:,.0f}/s,"
        f" replay/reader={result['replay_over_reader']:.2f})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
