"""A real HTTP server speaking the OpenAI chat-completions API, answering from a script (tests only).

Each request to ``POST /v1/chat/completions`` takes the next ``Turn`` of the script (the last one repeats):
an answer text with its token usage, an HTTP status, a delay longer than the client's timeout, or an answer
trickled a byte at a time (each byte within the client's socket timeout, the whole far beyond it). Every
request is recorded (headers and JSON body) so tests can check what the model saw and what was sent.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Turn:
    content: str = ""
    prompt_tokens: int = 100
    completion_tokens: int = 50
    status: int = 200
    delay_s: float = 0.0
    raw: bytes | None = None
    """Sent as the body instead of a chat-completions document (a broken server)."""
    trickle_s: float = 0.0
    """Seconds between the body's bytes (0: sent at once)."""


@dataclass
class ChatScript:
    turns: list[Turn]
    requests: list[dict[str, Any]] = field(default_factory=list)
    closed: threading.Event = field(default_factory=threading.Event)
    """Set when the server stops: a trickling answer stops too (the connection closes)."""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def next_turn(self, request: dict[str, Any]) -> Turn:
        with self._lock:
            self.requests.append(request)
            return self.turns[min(len(self.requests), len(self.turns)) - 1]


@contextmanager
def chat_server(script: ChatScript) -> Iterator[str]:
    """Serve ``script`` on a free port of 127.0.0.1; yields the base URL (``http://127.0.0.1:PORT/v1``)."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 — http.server's name
            length = int(self.headers.get("Content-Length", 0))
            body = json.loads(self.rfile.read(length) or b"{}")
            turn = script.next_turn({"path": self.path, "headers": dict(self.headers), "body": body})
            if turn.delay_s:
                time.sleep(turn.delay_s)
            if self.path != "/v1/chat/completions":
                self.send_response(404)
                self.end_headers()
                return
            if turn.raw is not None:
                payload = turn.raw
            else:
                payload = json.dumps({
                    "id": "chatcmpl-test", "object": "chat.completion", "model": body.get("model"),
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": turn.content}}],
                    "usage": {"prompt_tokens": turn.prompt_tokens, "completion_tokens": turn.completion_tokens,
                              "total_tokens": turn.prompt_tokens + turn.completion_tokens},
                }).encode()
            try:
                self.send_response(turn.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if not turn.trickle_s:
                    self.wfile.write(payload)
                for byte in payload if turn.trickle_s else b"":
                    if script.closed.wait(turn.trickle_s):
                        return
                    self.wfile.write(bytes([byte]))
                    self.wfile.flush()
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (a timeout test)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        script.closed.set()
        server.shutdown()
        server.server_close()
