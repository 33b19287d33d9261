"""Bus fuzzing: ≥ 10,000 bad messages on every consumed subject, then a valid study on the same stack.

    python bench/fuzz_bus.py [--messages 10000] [--trials 12] [--json]

A real stack (embedded nats-server, the six service processes) is fed, on every subject a durable consumer
selects, messages of six kinds, built here from the event catalog and not from the code under test:

- ``malformed``: random bytes, broken JSON;
- ``truncated``: a valid event of that subject's type cut short;
- ``oversized``: a valid envelope padded past the 4 MiB an event may take, up to 7 MB (a few, so the run stays
  small);
- ``wrong_typed``: an envelope whose payload has the wrong type for a field, or another type's tag;
- ``deep``: a valid envelope with a field nested 5,000 levels;
- ``wrong_owner``: a valid event whose source is a service that does not publish that type, or an event on
  another type's subject.

Then a valid simulator study runs on the same stack, and the same study (same id, so the same proposals) on a
fresh stack for reference. Prints: messages sent per kind; service crashes (a service process that died, or a
consume loop reported stalled); dead letters found for each (message, consuming service) pair, with a reason;
and whether the study's result equals the reference run's. Exit 0 when all of that holds.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import msgspec  # noqa: E402
import sim_study  # noqa: E402
from conftest import sample_struct  # noqa: E402
from infrarsi import events as ev  # noqa: E402
from infrarsi.bus import subjects  # noqa: E402
from infrarsi.bus.client import MAX_EVENT_BYTES, Bus  # noqa: E402
from infrarsi.bus.credentials import ADMIN  # noqa: E402
from infrarsi.bus.reader import read_stream  # noqa: E402
from infrarsi.runtime.stack import SERVICES, Stack, ping_services  # noqa: E402

STUDY_ID = "01fuzz00000000000000000000"
KINDS = ("malformed", "truncated", "oversized", "wrong_typed", "deep", "wrong_owner")


def consumed_types() -> dict[str, tuple[str, ...]]:
    """Event type → the services whose durable consumers select it (from the services' ``consumes``)."""
    from infrarsi_services.launcher.service import LauncherService
    from infrarsi_services.modeler.service import ModelerService
    from infrarsi_services.proposer.service import ProposerService
    from infrarsi_services.reporter.service import ReporterService
    from infrarsi_services.telemetry.service import TelemetryService
    from infrarsi_services.verifier.service import VerifierService

    out: dict[str, list[str]] = {}
    for cls in (ProposerService, LauncherService, TelemetryService, ModelerService, VerifierService, ReporterService):
        for t in cls.consumes:
            out.setdefault(t.__name__, []).append(cls.name)
    return {t: tuple(sorted(s)) for t, s in out.items()}


def valid_event(event_type: str, rng: random.Random, source: str | None = None) -> ev.Event:
    payload = sample_struct(getattr(ev, event_type))
    publishers = subjects.route(event_type).publishers
    study = f"fuzz{rng.randrange(10**6)}"
    return ev.make_event(payload, study_id=study, trial_id=f"t{rng.randrange(10**6)}", source=source or publishers[0],
                         cluster_id="fuzz")  # fmt: skip


def bad_message(kind: str, event_type: str, rng: random.Random) -> tuple[str, bytes]:
    """(subject, bytes) of one bad message of ``kind`` for a consumer of ``event_type``."""
    event = valid_event(event_type, rng)
    subject = subjects.subject_for(event)
    data = ev.encode(event)
    match kind:
        case "malformed":
            return subject, rng.choice([os.urandom(rng.randrange(1, 400)), b'{"event_id": ', b"null", b"[]", b'{"a":1}'])
        case "truncated":
            return subject, data[: rng.randrange(1, len(data) - 1)]
        case "oversized":
            return subject, data[:-1] + b', "padding": "' + b"x" * rng.randrange(MAX_EVENT_BYTES + 1, 7 << 20) + b'"}'
        case "wrong_typed":
            doc = msgspec.json.decode(data)
            if rng.random() < 0.5:
                field = rng.choice(sorted(k for k in doc["payload"] if k != "type") or ["type"])
                doc["payload"][field] = [[["not", "this"]]]
            else:
                doc["payload"]["type"] = rng.choice([t for t in ev.EVENT_TYPES if t != event_type])
            return subject, msgspec.json.encode(doc)
        case "deep":
            return subject, b'{"deep": ' + b"[" * 5000 + b"]" * 5000 + b", " + data[1:]
        case "wrong_owner":
            others = [p for p in SERVICES if p not in subjects.route(event_type).publishers]
            if others and rng.random() < 0.5:
                forged = valid_event(event_type, rng, source=rng.choice(others))
                return subjects.subject_for(forged), ev.encode(forged)
            other_type = rng.choice([t for t in consumed_types() if t != event_type and subjects.route(t).stream
                                     == subjects.route(event_type).stream and t != "TrialStep"] or [event_type])
            if other_type == event_type:
                return subject, data[:-1]  # nothing else on this stream: a truncated one instead
            return subjects.lifecycle_subject(event.study_id, other_type), data  # on another type's subject
    raise ValueError(kind)


async def alive_and_pulling(stack: Stack, bus: Bus, pids: dict[str, int]) -> dict[str, object]:
    replies = await ping_services(bus.nc, 1.0)
    by_name = {r["service"]: r for r in replies}
    return {
        "died": sorted(n for n, p in stack.processes.items() if not p.alive() or p.pid != pids[n]),
        "stalled": sorted(n for n, r in by_name.items() if r.get("stalled")),
        "not_answering": sorted(set(SERVICES) - set(by_name)),
    }


async def fuzz_then_study(root: Path, args: argparse.Namespace, contract: Path) -> dict[str, object]:
    rng = random.Random(args.seed)
    data_dir = root / "fuzzed" / "data"
    stack = await asyncio.to_thread(Stack.start, data_dir)
    try:
        pids = {n: p.pid for n, p in stack.processes.items()}
        bus = await Bus.connect(stack.url, service=ADMIN, data_dir=data_dir)
        consumers = consumed_types()
        sent: list[tuple[str, int, str, tuple[str, ...]]] = []  # (kind, stream seq, stream, services)
        per_kind: Counter[str] = Counter()
        types = sorted(consumers)
        started = time.monotonic()
        for i in range(args.messages):
            kind = "oversized" if i % max(1, args.messages // args.oversized) == 0 else rng.choice(
                [k for k in KINDS if k != "oversized"])
            event_type = types[i % len(types)]
            subject, data = bad_message(kind, event_type, rng)
            ack = await bus.publish_raw(subject, data)
            # who selects this subject: the consumers of the type its subject names
            named = {subjects.TELEMETRY_STREAM: "TrialStep", subjects.BANK_STREAM: "BankEntry"}.get(
                ack.stream, subject.split(".")[-1])
            sent.append((kind, ack.seq, ack.stream, consumers.get(named, ())))
            per_kind[kind] += 1
        publish_s = time.monotonic() - started
        expected = {(svc, stream, seq) for _k, seq, stream, svcs in sent for svc in svcs}

        async def letters() -> dict[tuple[str, str, int], str]:
            found = {}
            async for batch in read_stream(bus, subjects.LIFECYCLE_STREAM, subjects=f"{subjects.DEADLETTER_PREFIX}*"):
                for _seq, _subject, data in batch:
                    letter = msgspec.json.decode(data, type=ev.DeadLetter)
                    stream = (subjects.TELEMETRY_STREAM if letter.subject.startswith("irsi.telemetry.") else
                              subjects.BANK_STREAM if letter.subject.startswith("bank.") else subjects.LIFECYCLE_STREAM)
                    found[(letter.service, stream, letter.stream_seq)] = letter.error
            return found

        deadline = time.monotonic() + args.timeout
        found, grew_at = await letters(), time.monotonic()
        while not expected <= set(found) and time.monotonic() < deadline and time.monotonic() - grew_at < 30.0:
            await asyncio.sleep(2.0)
            before, found = len(found), await letters()
            if len(found) > before:
                grew_at = time.monotonic()
        lettered = expected & set(found)
        health_after_fuzz = await alive_and_pulling(stack, bus, pids)
        missing = [(k, seq, stream, s) for k, seq, stream, svcs in sent for s in svcs if (s, stream, seq) not in found]
        missing_by_kind = Counter(m[0] for m in missing)

        await sim_study.create_study(bus, contract, data_dir, STUDY_ID)
        finished = await sim_study.run_study(bus, STUDY_ID, trials=args.trials, parallel=1, timeout_s=args.timeout)
        health_after_study = await alive_and_pulling(stack, bus, pids)
        ledger = sim_study.study_ledger(await sim_study.lifecycle(bus, STUDY_ID))
        await bus.close()
    finally:
        await asyncio.to_thread(stack.stop)
    return {
        "messages": len(sent),
        "per_kind": dict(per_kind),
        "subjects": len(types),
        "publish_s": round(publish_s, 1),
        "expected_dead_letters": len(expected),
        "dead_lettered": len(lettered),
        "dead_lettered_share": round(len(lettered) / len(expected), 6) if expected else 1.0,
        "letters_without_reason": sum(1 for k in lettered if not found[k]),
        "missing_by_kind": dict(missing_by_kind),
        "missing_examples": [{"kind": k, "seq": seq, "stream": stream, "service": s} for k, seq, stream, s in missing[:5]],
        "reasons": dict(Counter(found[k].split(":")[0][:40] for k in lettered).most_common(8)),
        "crashes": len(health_after_fuzz["died"]) + len(health_after_study["died"]),
        "health_after_fuzz": health_after_fuzz,
        "health_after_study": health_after_study,
        "result": sim_study.result_of(finished, ledger),
        "study": ledger,
    }


async def measure(args: argparse.Namespace) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="irsi-fuzz-") as tmp:
        root = Path(tmp)
        contract = sim_study.write_contract(root / "fuzzed", trials=args.trials, parallel=1)
        fuzzed = await fuzz_then_study(root, args, contract)
        # The same workload written again (its own repo: the study id's golden tag is taken in the first).
        twin = sim_study.write_contract(root / "reference", trials=args.trials, parallel=1)
        fuzzed["reference_result"] = await sim_study.reference_result(root / "reference" / "data", twin, STUDY_ID,
                                                                      trials=args.trials, timeout_s=args.timeout)
    keys = ("best_candidate_key", "search_trials")
    fuzzed["study_unaffected"] = (fuzzed["result"] is not None and fuzzed["reference_result"] is not None
                                  and all(fuzzed["result"][k] == fuzzed["reference_result"][k] for k in keys))
    return fuzzed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--oversized", type=int, default=12, help="how many of the messages are 4–7 MB")
    parser.add_argument("--trials", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=1200.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = sim_study.run_and_print(measure(args), as_json=args.json)
    ok = result["crashes"] == 0 and result["dead_lettered_share"] == 1.0 and result["study_unaffected"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
