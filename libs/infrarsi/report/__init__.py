"""Study reports: the model built by SQL over the analyst DuckDB, and its HTML/Markdown/PDF renderers.

Owns turning the event log (as the analyst DB holds it) into an audit report. It reads the DB and the
workload's patch files; it never publishes (``infrarsi report`` and the reporter service do that).
"""

from infrarsi.report.model import OUTCOMES, Report, TrialRow, Verdict, build_report
from infrarsi.report.render import outline, render_all, render_html, render_markdown, render_pdf

__all__ = [
    "OUTCOMES",
    "Report",
    "TrialRow",
    "Verdict",
    "build_report",
    "outline",
    "render_all",
    "render_html",
    "render_markdown",
    "render_pdf",
]
