"""A client for any OpenAI-compatible chat-completions endpoint (vLLM, SGLang, llama.cpp's server, Ollama,
hosted APIs), with the study's token budget and secret redaction.

Owns: resolving the endpoint (``resolve_endpoint``: the contract's ``agent`` section first, then
``INFRARSI_LLM_BASE_URL``/``INFRARSI_LLM_MODEL``; the key from ``INFRARSI_LLM_API_KEY`` or a key file, never
from the contract), one ``POST {base_url}/chat/completions`` per attempt with a timeout, retries with
exponential backoff on timeouts, connection errors, 429 and 5xx, the ``TokenBudget`` of a study, and
``redact``: the key (and anything shaped like a bearer token) replaced before text leaves this module.

An exchange ends by its deadline (``ChatClient.exchange_s``: every attempt's timeout and the backoff between
them), whatever the server does: the socket timeout bounds each read, not the whole answer, so a server that
trickles a byte at a time within it would hold the calling thread for as long as it likes. At the deadline
the client shuts its connection down from a timer thread, the blocked read returns and ``chat`` raises
``timeout``; a caller that gave up earlier (``role.answer_within``) thus gets its thread back by then. The
endpoint is reached directly (``http.client``: no proxy, no redirect).

Failures are ``AgentError`` with a ``kind`` from ``events.AgentRefusalKind`` (``timeout``, ``http_error``,
``budget_exceeded``, ``malformed``) so callers record them by name. Uses only the standard library (no HTTP
dependency for an optional part). Must not: publish, log a key, or decide what an answer means.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from infrarsi import events as ev
from infrarsi.runtime.settings import Settings, env_var
from infrarsi.study.contract import AgentSpec

ENV_BASE_URL = env_var("llm_base_url")
ENV_MODEL = env_var("llm_model")

REDACTED = "[REDACTED]"
# Bearer tokens and the usual API-key shapes (sk-…, hf_…) also leave as [REDACTED], even when they are not this
# study's key: a prompt may quote a repository file that holds one.
_SECRET_SHAPES = re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{8,}|\b(?:sk|hf|ghp|xox[bap])[-_][A-Za-z0-9_-]{16,}")


class AgentError(Exception):
    """An exchange that produced no usable answer; ``kind`` names why."""

    def __init__(self, kind: ev.AgentRefusalKind, detail: str, *, attempts: int = 1,
                 prompt_tokens: int = 0, completion_tokens: int = 0) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail
        self.attempts = attempts
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = completion_tokens


class AgentUnconfigured(Exception):
    """No endpoint or model configured: the study runs without the agent."""


@dataclass(frozen=True)
class Endpoint:
    """Where to ask. ``repr`` never shows the key."""

    base_url: str
    model: str
    api_key: str | None = field(default=None, repr=False)

    @property
    def secrets(self) -> tuple[str, ...]:
        return (self.api_key,) if self.api_key else ()


def resolve_endpoint(spec: AgentSpec, env: Mapping[str, str] | None = None) -> Endpoint:
    """The endpoint of a study: the contract's ``agent`` section, else the environment.

    Raises ``AgentUnconfigured`` when no base URL or model is known, and ``AgentError('malformed')`` when a
    key file is named but unreadable (a misconfiguration the user must hear about, not a silent no-agent)."""
    settings = Settings.from_env(env)  # the INFRARSI_LLM_* variables, validated with the others
    base_url = spec.base_url or settings.llm_base_url or ""
    model = spec.model or settings.llm_model or ""
    if not base_url or not model:
        missing = [name for name, value in ((ENV_BASE_URL, base_url), (ENV_MODEL, model)) if not value]
        raise AgentUnconfigured(f"no language model configured (agent.base_url/agent.model or {', '.join(missing)})")
    key = settings.llm_api_key or None
    key_file = spec.key_file or settings.llm_api_key_file
    if key is None and key_file:
        try:
            key = Path(key_file).expanduser().read_text().strip().splitlines()[0].strip() or None
        except (OSError, IndexError) as exc:
            raise AgentError("malformed", f"API key file {key_file} unreadable: {type(exc).__name__}") from None
    return Endpoint(base_url=base_url.rstrip("/"), model=model, api_key=key)


def redact(text: str, secrets: Sequence[str] = ()) -> str:
    """``text`` with each secret (and anything shaped like a bearer token or API key) replaced."""
    for secret in secrets:
        if secret:
            text = text.replace(secret, REDACTED)
    return _SECRET_SHAPES.sub(lambda m: (m.group(1) or "") + REDACTED, text)


@dataclass
class TokenBudget:
    """A study's ``budget.llm_tokens`` (and ``budget.llm_usd``): what is left decides whether to ask at all,
    and an answer that overruns it is counted and refused (``budget_exceeded``)."""

    tokens: int
    usd: float | None = None
    usd_per_1k_tokens: float = 0.0
    spent_tokens: int = 0

    @property
    def spent_usd(self) -> float:
        return self.spent_tokens / 1000.0 * self.usd_per_1k_tokens

    def cost(self, tokens: int) -> float:
        return tokens / 1000.0 * self.usd_per_1k_tokens

    def left(self) -> int:
        left = self.tokens - self.spent_tokens
        if self.usd is not None and self.usd_per_1k_tokens > 0:
            left = min(left, int((self.usd - self.spent_usd) / self.usd_per_1k_tokens * 1000.0))
        return max(0, left)

    def charge(self, tokens: int) -> bool:
        """Count ``tokens``; False when that overran the budget."""
        self.spent_tokens += tokens
        over_usd = self.usd is not None and self.spent_usd > self.usd + 1e-12
        return self.spent_tokens <= self.tokens and not over_usd


@dataclass(frozen=True)
class ChatReply:
    text: str
    prompt_tokens: int
    completion_tokens: int
    attempts: int
    latency_s: float


Sleep = Callable[[float], None]


BACKOFF_S = 1.0
"""The wait before a client's first retry; it doubles for each one after."""


def exchange_seconds(timeout_s: float, retries: int, backoff_s: float = BACKOFF_S) -> float:
    """The longest one exchange takes: ``timeout_s`` per attempt and the backoff between attempts (doubling)."""
    return timeout_s * (retries + 1) + sum((backoff_s * (1 << i) for i in range(retries)), 0.0)


@dataclass
class ChatClient:
    """Blocking chat completions against one endpoint (callers run it in a thread)."""

    endpoint: Endpoint
    timeout_s: float = 60.0
    retries: int = 2
    backoff_s: float = BACKOFF_S
    sleep: Sleep = time.sleep

    @classmethod
    def for_spec(cls, spec: AgentSpec, env: Mapping[str, str] | None = None) -> ChatClient:
        return cls(resolve_endpoint(spec, env), timeout_s=spec.timeout_s, retries=spec.retries)

    def redact(self, text: str) -> str:
        return redact(text, self.endpoint.secrets)

    @property
    def exchange_s(self) -> float:
        """The longest one ``chat`` takes (``exchange_seconds`` of this client's settings)."""
        return exchange_seconds(self.timeout_s, self.retries, self.backoff_s)

    def chat(self, messages: Sequence[ev.AgentMessage], *, max_tokens: int) -> ChatReply:
        """One answer (``choices[0].message.content``), retried on transient failures, by ``exchange_s`` at the
        latest; raises ``AgentError``."""
        body = json.dumps({
            "model": self.endpoint.model,
            "messages": [{"role": m.role, "content": m.content} for m in messages],
            "max_tokens": max_tokens,
            "temperature": 0,
        }).encode()
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.endpoint.api_key:
            headers["Authorization"] = f"Bearer {self.endpoint.api_key}"
        t0 = time.monotonic()
        deadline = t0 + self.exchange_s
        last: AgentError | None = None
        for attempt in range(1, self.retries + 2):
            if attempt > 1:
                self.sleep(self.backoff_s * 2 ** (attempt - 2))
            if time.monotonic() >= deadline:
                break
            try:
                raw = self._post(body, headers, deadline)
            except _Transient as exc:
                last = AgentError(exc.kind, self.redact(exc.detail), attempts=attempt)
                continue
            except AgentError as exc:
                exc.attempts = attempt
                raise
            text, prompt_tokens, completion_tokens = self._parse(raw, attempt)
            if not prompt_tokens and not completion_tokens:
                # A server that reports no usage is charged by an estimate (4 characters a token).
                prompt_tokens = sum(len(m.content) for m in messages) // 4
                completion_tokens = max(1, len(text) // 4)
            return ChatReply(self.redact(text), prompt_tokens, completion_tokens, attempt, time.monotonic() - t0)
        raise last or AgentError("timeout", f"no answer within {self.exchange_s:g}s from {self.endpoint.base_url}")

    def _post(self, body: bytes, headers: dict[str, str], deadline: float) -> bytes:
        """One attempt; its connection is shut down at ``deadline`` if it is still open then."""
        base = urllib.parse.urlsplit(self.endpoint.base_url)
        connection_type = http.client.HTTPSConnection if base.scheme == "https" else http.client.HTTPConnection
        left = deadline - time.monotonic()
        connection = connection_type(base.hostname or "", base.port, timeout=min(self.timeout_s, max(left, 0.001)))
        cut: threading.Timer | None = None
        where = self.endpoint.base_url
        try:
            connection.connect()
            # the socket itself: once the response owns the connection (HTTP/1.0, ``Connection: close``),
            # ``connection.sock`` is None while the response still reads from this socket
            cut = threading.Timer(max(0.0, deadline - time.monotonic()), _shut_down, args=(connection.sock,))
            cut.daemon = True
            cut.start()
            connection.request("POST", f"{base.path.rstrip('/')}/chat/completions", body, headers)
            response = connection.getresponse()
            answer = response.read()
            if response.status >= 400:
                detail = f"HTTP {response.status} from {where}: {answer[:500].decode(errors='replace')}"
                if response.status == 429 or response.status >= 500:
                    raise _Transient("http_error", detail)
                raise AgentError("http_error", self.redact(detail))
            if time.monotonic() >= deadline:  # the cut may leave a short body that parses: it still came too late
                raise _Transient("timeout", f"no answer within {self.exchange_s:g}s from {where} (cut off)")
            return answer
        except TimeoutError:
            raise _Transient("timeout", f"no answer within {self.timeout_s:g}s from {where}") from None
        except (http.client.HTTPException, OSError) as exc:
            if time.monotonic() >= deadline:
                raise _Transient("timeout", f"no answer within {self.exchange_s:g}s from {where} (cut off)") from None
            raise _Transient("http_error", f"connection to {where} failed: {type(exc).__name__}: {exc}") from None
        finally:
            if cut is not None:
                cut.cancel()
            connection.close()

    def _parse(self, raw: bytes, attempt: int) -> tuple[str, int, int]:
        try:
            doc = json.loads(raw)
            text = doc["choices"][0]["message"]["content"]
            usage = doc.get("usage") or {}
            prompt_tokens = int(usage.get("prompt_tokens", 0))
            completion_tokens = int(usage.get("completion_tokens", 0))
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise AgentError("malformed", self.redact(f"not a chat-completions response ({type(exc).__name__}): "
                                                      f"{raw[:300].decode(errors='replace')}"),
                             attempts=attempt) from None
        if not isinstance(text, str):
            raise AgentError("malformed", "choices[0].message.content is not text", attempts=attempt)
        return text, prompt_tokens, completion_tokens


def _shut_down(sock: socket.socket) -> None:
    """End a blocked read on ``sock`` from another thread (``close`` alone would not wake it)."""
    with contextlib.suppress(OSError):  # already closed
        sock.shutdown(socket.SHUT_RDWR)


class _Transient(Exception):
    def __init__(self, kind: ev.AgentRefusalKind, detail: str) -> None:
        super().__init__(detail)
        self.kind = kind
        self.detail = detail
