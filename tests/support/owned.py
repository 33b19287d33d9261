"""Events as their owners publish them: services refuse an event whose ``source`` the subjects table does not
list as a publisher of its type, so a test that plays a service or a CLI verb publishes under its name."""

from __future__ import annotations

from infrarsi import events as ev
from infrarsi.bus import subjects


def owned_event(payload, *, study_id: str, **fields) -> ev.Event:
    """``payload`` in an envelope from its type's first listed publisher (``subjects.ROUTES``)."""
    return ev.make_event(payload, study_id=study_id, source=subjects.route(type(payload).__name__).publishers[0], **fields)
