"""schemas/ is generated from the code (``make schemas``) and must not drift from it."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from infrarsi import events as ev

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gen_schemas():
    spec = importlib.util.spec_from_file_location("gen_schemas", ROOT / "scripts" / "gen_schemas.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_schemas_directory_is_up_to_date(gen_schemas) -> None:
    stale = gen_schemas.stale(ROOT / "schemas")
    assert not stale, f"schemas/ is stale ({', '.join(stale)}): run `make schemas` and commit the result"


def test_events_schema_covers_every_payload_and_the_envelope(gen_schemas) -> None:
    schema = json.loads(gen_schemas.render()["events.schema.json"])
    defs = schema["$defs"]
    assert set(ev.EVENT_TYPES) <= set(defs)
    envelope = defs["Event"]
    assert set(envelope["required"]) >= {"event_id", "type", "study_id", "cluster_id", "source", "ts", "payload"}
    for name in ev.EVENT_TYPES:
        tag = defs[name]["properties"]["type"]
        assert tag == {"enum": [name]}, f"{name} is tagged by its class name on the wire"


def test_drift_is_detected(gen_schemas, tmp_path: Path) -> None:
    # The check above must be able to fail: an edited copy is reported, a fresh render is not.
    assert gen_schemas.main(["--out", str(tmp_path)]) == 0
    assert gen_schemas.stale(tmp_path) == []
    events = tmp_path / "events.schema.json"
    events.write_text(events.read_text().replace('"TrialFinished"', '"TrialDone"'))
    assert gen_schemas.stale(tmp_path) == ["events.schema.json"]
    assert gen_schemas.main(["--check", "--out", str(tmp_path)]) == 1


def test_rendering_is_stable(gen_schemas) -> None:
    assert gen_schemas.render() == gen_schemas.render()
