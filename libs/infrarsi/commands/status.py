"""``infrarsi status``: is the stack alive, what is in the log, and how far behind is each consumer.

Pings the services (``irsi-svc.ping``: pid, uptime, handled, dead-lettered, in-flight, and any consume
loop that stopped pulling), reads the message counts of the three streams and the lag of every durable
consumer (messages not yet delivered + delivered but not yet acked). Read-only: it creates and changes
nothing on the server. Exit code 0 when every expected service answered with no stalled consumer, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

import nats.js.errors

from infrarsi.bus.client import STREAMS
from infrarsi.runtime.stack import PING_WINDOW_S, SERVICES, connect_for_cli, ping_services

if TYPE_CHECKING:
    from infrarsi.bus.client import Bus



def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--timeout", type=float, default=PING_WINDOW_S, help="seconds to collect ping replies")


async def collect(bus: Bus, timeout_s: float = PING_WINDOW_S) -> dict[str, Any]:
    """The status document ``--json`` prints."""
    replies = await ping_services(bus.nc, timeout_s)
    services: dict[str, Any] = {name: {"alive": False} for name in SERVICES}
    for reply in replies:
        name = str(reply.get("service"))
        entry = {"alive": True, **reply}
        if services.get(name, {}).get("alive"):
            services[name].setdefault("replicas", []).append(entry)  # several instances of one service
        else:
            services[name] = entry
    consumers: dict[str, dict[str, Any]] = {}
    for spec in STREAMS:
        try:
            infos = await bus.js.consumers_info(spec.name)
        except nats.js.errors.NotFoundError:
            continue
        for info in infos:
            durable = info.config.durable_name
            if not durable:
                continue  # ephemeral readers (replays, `events tail`) are not part of the pipeline
            consumers.setdefault(spec.name, {})[durable] = {
                "num_pending": info.num_pending,
                "num_ack_pending": info.num_ack_pending,
                "num_redelivered": info.num_redelivered,
                "lag": (info.num_pending or 0) + (info.num_ack_pending or 0),
            }
    return {
        "nats_url": bus.nc.connected_url.geturl() if bus.nc.connected_url else None,
        "services": services,
        "streams": await bus.stream_counts(),
        "consumers": consumers,
    }


async def run(args: argparse.Namespace) -> int:
    bus = await connect_for_cli(args.nats_url, args.data_dir, "cli.status", ensure=False)
    try:
        doc = await collect(bus, args.timeout)
    finally:
        await bus.close()
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True))
    else:
        print(render(doc))
    healthy = all(doc["services"][name]["alive"] and not doc["services"][name].get("stalled") for name in SERVICES)
    return 0 if healthy else 1


def render(doc: dict[str, Any]) -> str:
    lines = [f"NATS {doc['nats_url']}", "", "services"]
    lines.append(f"  {'name':<10} {'state':<6} {'pid':>8} {'uptime':>9} {'handled':>8} {'dead':>5} {'busy':>5}")
    for name, svc in doc["services"].items():
        if not svc["alive"]:
            lines.append(f"  {name:<10} {'DOWN':<6}")
            continue
        stalled = svc.get("stalled") or []
        lines.append(
            f"  {name:<10} {'STALL' if stalled else 'up':<6} {svc['pid']:>8} {svc['uptime_s']:>8.0f}s "
            f"{svc['handled']:>8} {svc['dead_lettered']:>5} {svc['in_flight']:>5}"
            + (f"  not pulling: {', '.join(stalled)}" if stalled else "")
        )
    lines += ["", "streams"]
    for stream, counts in doc["streams"].items():
        lines.append(f"  {stream:<15} {counts['messages']:>9} msgs {counts['bytes']:>12} bytes")
    lines += ["", "consumers (lag = pending + unacked)"]
    for stream, durables in doc["consumers"].items():
        for durable, info in sorted(durables.items()):
            lines.append(f"  {stream:<15} {durable:<26} lag {info['lag']:>6}  redelivered {info['num_redelivered']}")
    return "\n".join(lines)
