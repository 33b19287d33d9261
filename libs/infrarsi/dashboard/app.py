"""The dashboard's web application (Starlette): one page, its JSON API, a server-sent event stream and plotly.js.

Routes, all ``GET`` (read-only: any other method is answered 405):

- ``/`` the page (``static/index.html``), ``/static/…`` its script and style;
- ``/vendor/plotly.min.js`` plotly.js as the installed ``plotly`` package ships it (nothing from a CDN: the page
  works on a host that reaches nothing outside);
- ``/api/studies``, ``/api/studies/{id}``, ``/api/studies/{id}/trials/{trial}`` the views
  (``infrarsi.dashboard.views``) as JSON;
- ``/api/state`` the feed's version and last error; ``/api/stream`` server-sent events: ``version`` each time
  the private DB moved, so the page fetches again within a catch-up of an event landing on the bus.

Queries run in worker threads on a cursor of their own (DuckDB's concurrent readers), beside the feed's writes.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from importlib import resources
from typing import Any

import msgspec
from plotly.offline import get_plotlyjs
from starlette.applications import Starlette
from starlette.datastructures import Headers, QueryParams
from starlette.middleware import Middleware
from starlette.requests import Request, cookie_parser
from starlette.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Receive, Scope, Send

from infrarsi.dashboard import views
from infrarsi.dashboard.access import COOKIE, Access
from infrarsi.dashboard.feed import LiveFeed
from infrarsi.eventlog import AnalystDB

STREAM_KEEPALIVE_S = 15.0
"""A comment line at least this often on ``/api/stream``, so proxies and the browser keep the stream open."""


class _MsgspecJSON(JSONResponse):
    def render(self, content: Any) -> bytes:
        return msgspec.json.encode(content, enc_hook=str)


@functools.cache
def _plotly_js() -> bytes:
    js: str = get_plotlyjs()
    return js.encode()


def _static_dir() -> str:
    return str(resources.files("infrarsi.dashboard") / "static")


class RequireToken:
    """ASGI middleware: a request that does not present ``access``'s token gets 401 and nothing else (a plain
    ASGI wrapper rather than Starlette's ``BaseHTTPMiddleware``, which buffers through a task group that a
    long-lived event stream outlives)."""

    def __init__(self, app: ASGIApp, access: Access) -> None:
        self.app = app
        self.access = access

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = Headers(scope=scope)
            cookies = cookie_parser(headers.get("cookie", ""))
            token = QueryParams(scope.get("query_string", b"")).get("token")
            if not self.access.allows(headers.get("authorization"), cookies.get(COOKIE), token):
                refused = Response("the dashboard's token is required (docs/dashboard.md)\n", status_code=401,
                                   headers={"WWW-Authenticate": 'Basic realm="infrarsi dashboard"'})
                await refused(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(db: AnalystDB, feed: LiveFeed | None, access: Access, *, stopping: asyncio.Event | None = None,
               title: str = "InfraRSI") -> Starlette:
    """The application over ``db`` (kept current by ``feed``; ``None``: a fixed file) behind ``access``.
    ``stopping``: set when the server shuts down, so that open event streams end at once."""
    stopping = stopping or asyncio.Event()

    async def query(fn: Any, *args: Any) -> Any:
        def run() -> Any:
            cursor = db.con.cursor()
            try:
                cursor.execute("SET TimeZone = 'UTC'")
                return fn(cursor, *args)
            finally:
                cursor.close()

        return await asyncio.to_thread(run)

    async def page(request: Request) -> Response:
        token = request.query_params.get("token")
        if token is not None and access.token is not None:
            # The token came in the address: keep it in a cookie and drop it from the address bar and history.
            response = RedirectResponse("/", status_code=303)
            response.set_cookie(COOKIE, token, httponly=True, secure=True, samesite="strict")
            return response
        html = (resources.files("infrarsi.dashboard") / "static" / "index.html").read_text()
        return Response(html.replace("{{title}}", title), media_type="text/html")

    async def plotly_js(request: Request) -> Response:
        return Response(_plotly_js(), media_type="text/javascript", headers={"Cache-Control": "max-age=86400"})

    async def studies(request: Request) -> Response:
        return _MsgspecJSON(await query(views.studies))

    async def study(request: Request) -> Response:
        try:
            return _MsgspecJSON(await query(views.study, request.path_params["study_id"]))
        except views.UnknownStudy as exc:
            return _MsgspecJSON({"error": f"no study {exc.args[0]!r} in the analyst DB"}, status_code=404)

    async def trial(request: Request) -> Response:
        study_id, trial_id = request.path_params["study_id"], request.path_params["trial_id"]
        try:
            return _MsgspecJSON(await query(views.trial_detail, study_id, trial_id))
        except views.UnknownStudy:
            return _MsgspecJSON({"error": f"no study {study_id!r} in the analyst DB"}, status_code=404)
        except views.UnknownTrial:
            return _MsgspecJSON({"error": f"no trial {trial_id!r} in study {study_id!r}"}, status_code=404)

    async def state(request: Request) -> Response:
        return _MsgspecJSON({
            "live": feed is not None,
            "version": feed.version if feed else 0,
            "error": feed.error if feed else None,
            "db": str(db.path),
        })

    async def stream(request: Request) -> Response:
        async def events() -> AsyncIterator[str]:
            version = feed.version if feed else 0
            yield f"retry: 2000\nevent: version\ndata: {version}\n\n"
            while feed is not None and not stopping.is_set():
                newer_task = asyncio.ensure_future(feed.wait_newer(version, STREAM_KEEPALIVE_S))
                stop_task = asyncio.ensure_future(stopping.wait())
                try:
                    await asyncio.wait({newer_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for task in (newer_task, stop_task):
                        task.cancel()
                if stopping.is_set():
                    return
                newer = newer_task.result()
                if newer == version:
                    yield ": keep-alive\n\n"
                    continue
                version = newer
                yield f"event: version\ndata: {version}\n\n"

        return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    routes = [
        Route("/", page),
        Route("/vendor/plotly.min.js", plotly_js),
        Route("/api/studies", studies),
        Route("/api/studies/{study_id}", study),
        Route("/api/studies/{study_id}/trials/{trial_id}", trial),
        Route("/api/state", state),
        Route("/api/stream", stream),
        Mount("/static", app=StaticFiles(directory=_static_dir()), name="static"),
    ]
    return Starlette(routes=routes, middleware=[Middleware(RequireToken, access=access)])
