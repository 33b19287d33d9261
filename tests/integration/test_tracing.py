"""One trace across processes: the W3C ``traceparent`` rides in NATS headers from hop to hop."""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest
from infrarsi import events as ev
from infrarsi.bus import subjects
from infrarsi.bus.client import Bus
from support.owned import owned_event

pytestmark = pytest.mark.integration

HELPERS = Path(__file__).parent / "helper_services.py"


def _spans(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def test_event_chain_across_two_processes_is_one_trace(
    fresh_nats_server, tmp_path, spawn_service, wait_answering, wait_for, payload_samples
) -> None:
    relay_spans = tmp_path / "relay-spans.jsonl"
    modeler_spans = tmp_path / "modeler-spans.jsonl"
    bus = await Bus.connect(fresh_nats_server, service="test")
    try:
        relay = spawn_service("relay", fresh_nats_server, script=HELPERS, env={"INFRARSI_TRACE_FILE": str(relay_spans)})
        modeler = spawn_service("modeler", fresh_nats_server, env={"INFRARSI_TRACE_FILE": str(modeler_spans)})
        await wait_answering(bus, relay, modeler)

        trace_id, root_span_id = secrets.token_hex(16), secrets.token_hex(8)
        study = ev.new_id()
        proposed = owned_event(payload_samples["TrialProposed"], study_id=study, trial_id="t-1")  # type: ignore[arg-type]
        await bus.js.publish(
            subjects.subject_for(proposed),
            ev.encode(proposed),
            headers={"Nats-Msg-Id": proposed.event_id, "traceparent": f"00-{trace_id}-{root_span_id}-01"},
        )

        def handled(path: Path, name: str):
            return [s for s in _spans(path) if s["name"] == name and s["attributes"].get("infrarsi.study_id") == study]

        (relay_span,) = await wait_for(lambda: handled(relay_spans, "relay.handle TrialProposed"))
        (modeler_span,) = await wait_for(lambda: handled(modeler_spans, "modeler.handle TrialFinished"))

        assert relay_span["trace_id"] == trace_id
        assert relay_span["parent_span_id"] == root_span_id
        assert relay_span["service"] == "infrarsi-relay"
        assert modeler_span["trace_id"] == trace_id
        assert modeler_span["parent_span_id"] == relay_span["span_id"], "the second hop must be a child of the first"
        assert modeler_span["service"] == "infrarsi-modeler"
        assert modeler_span["attributes"]["infrarsi.trial_id"] == "t-1"

        # The logs carry the same trace id (structlog processor), so a trace and its log lines join up.
        lines = [json.loads(line) for line in modeler.log().splitlines() if line.startswith("{")]
        assert any(line.get("trace_id") == trace_id and line.get("study_id") == study for line in lines)
    finally:
        await bus.close()
