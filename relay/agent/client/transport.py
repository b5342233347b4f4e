"""HTTP to the relay: the settings check, retries with backoff, and answers turned into results or errors."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Self
from urllib.parse import urlsplit

import requests

from relay.agent.client.errors import (
    _CODE_SYMBOL,
    _STATUS_SYMBOL,
    ConfigurationError,
    RateLimited,
    RelayConnectionError,
    RelayError,
    error_class,
)
from relay.agent.retry_after import parse_retry_after


def check_settings(base_url: str, api_key: str) -> None:
    """Refuse a base URL that is not an http(s) root URL, or a key no header can carry.

    Raises ConfigurationError naming ``RELAY_URL`` or ``RELAY_API_KEY`` (the variables the
    CLI and the MCP server read them from).
    """
    try:
        parts = urlsplit(base_url or "")
        parts.port  # noqa: B018  (raises on a bad port)
    except ValueError as exc:
        raise ConfigurationError(f"RELAY_URL is not a valid URL ({exc}): {base_url!r}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or any(ord(c) <= 0x20 for c in base_url):
        raise ConfigurationError(
            f"RELAY_URL must be the relay's http:// or https:// root URL, such as "
            f"http://127.0.0.1:8000, got {base_url!r}"
        )
    if not api_key or any(ord(c) <= 0x20 or ord(c) >= 0x7F for c in api_key):
        raise ConfigurationError("RELAY_API_KEY must be the ah_live_... key as printed, with no spaces or line breaks")


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and what it wraps: ``__cause__``/``__context__``, urllib3's ``reason``, exception args."""
    todo, seen = [exc], set()
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        wrapped = [current.__cause__, current.__context__, getattr(current, "reason", None), *current.args]
        todo += [w for w in wrapped if isinstance(w, BaseException)]


def transport_reason(exc: BaseException) -> str:
    """A failed connection's cause in a few words: ``"connection refused"``, ``"timed out"``, ..."""
    causes = list(_causes(exc))
    if any(isinstance(c, ConnectionRefusedError) for c in causes):
        return "connection refused"
    if any(isinstance(c, (requests.Timeout, TimeoutError)) or "Timeout" in type(c).__name__ for c in causes):
        return "timed out"
    if any(type(c).__name__ in ("RemoteDisconnected", "ChunkedEncodingError", "IncompleteRead") for c in causes):
        return "connection dropped before the answer"
    if any(isinstance(c, ConnectionResetError) for c in causes):
        return "connection reset"
    if any(type(c).__name__ in ("NameResolutionError", "gaierror") for c in causes):
        return "host name not found"
    text = " ".join(str(exc).split())
    return "connection refused" if "refused" in text.lower() else (text[:160] or "no answer")


@dataclass(frozen=True)
class RetryNotice:
    """What :class:`RelayClient` tells its ``on_retry`` callback before it sleeps and tries again.

    ``retry`` is this retry's number (1 for the second attempt) out of ``retries``
    (``max_retries``); ``delay`` the seconds it will sleep first; ``reason`` why the last
    attempt failed (``"timed out"``, ``"HTTP 503"``, ``"rate limited (HTTP 429)"``, ...);
    ``connection`` whether the attempt got no answer at all.
    """

    verb: str
    url: str
    retry: int
    retries: int
    delay: float
    reason: str
    connection: bool


def _retry_after(resp: requests.Response) -> float | None:
    seconds = parse_retry_after(resp.headers.get("Retry-After"))
    return None if seconds is None else float(seconds)


class Transport:
    """The HTTP under :class:`RelayClient`: one session to one relay, with the client's retries (see its docstring)."""

    base_url: str
    api_key: str
    timeout: float
    max_retries: int
    backoff: float
    retry_refused: bool
    on_retry: Callable[[RetryNotice], None] | None
    session: requests.Session
    _own_session: bool
    _sleep: Callable[[float], None]
    _ids: Iterator[int]

    #: cap on one exponential-backoff wait, seconds
    max_backoff: float = 30.0
    #: the longest ``Retry-After`` the client will sleep through, seconds
    max_retry_wait: float = 60.0

    def close(self) -> None:
        """Close the HTTP session if this client created it."""
        if self._own_session:
            self.session.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}", "Accept": "application/json"}

    def _delay(self, attempt: int) -> float:
        base = min(self.max_backoff, self.backoff * (2**attempt))
        return base + random.uniform(0, base / 4)

    def _rpc(self, method: str, params: dict[str, Any]) -> Any:
        """Call one JSON-RPC method; return its ``result`` or raise the error's class."""
        envelope = {"jsonrpc": "2.0", "id": next(self._ids), "method": method, "params": params}

        def rpc_unavailable(resp: requests.Response) -> bool:
            # -32603 service_unavailable comes with HTTP 200 inside a JSON-RPC answer when the
            # database dropped mid-request: the relay asks to retry, like a 503.
            if resp.status_code != 200:
                return False
            try:
                err = resp.json().get("error") or {}
            except (ValueError, AttributeError):
                return False
            data = err.get("data")
            return isinstance(data, dict) and data.get("symbol") == "service_unavailable"

        resp, attempts = self._exchange("POST", "/a2a", json_body=envelope, retry_also=rpc_unavailable)
        doc = self._json(resp)
        if resp.status_code == 200 and isinstance(doc, dict) and "result" in doc and "error" not in doc:
            return doc["result"]
        if isinstance(doc, dict) and isinstance(doc.get("error"), dict):
            err = doc["error"]
            data = err.get("data")
            symbol = data.get("symbol") if isinstance(data, dict) else None
            code = err.get("code") if isinstance(err.get("code"), int) else None
            if symbol is None:
                symbol = _CODE_SYMBOL.get(code) or _STATUS_SYMBOL.get(resp.status_code)
            raise self._make_error(resp, attempts, symbol, code, str(err.get("message") or ""), data)
        raise self._make_error(
            resp,
            attempts,
            _STATUS_SYMBOL.get(resp.status_code),
            None,
            f"unexpected answer to {method} (HTTP {resp.status_code}): {resp.text[:200]}",
            None,
        )

    def _rest(
        self,
        verb: str,
        path: str,
        params: Mapping[str, Any] | None = None,
        json_body: Any = None,
        *,
        timeout: float | tuple[float, float] | None = None,
    ) -> Any:
        """One REST call; return its JSON body (None for 204) or raise the error's class.

        ``timeout`` overrides the client's for this call (a long-poll waits longer than that)."""
        resp, attempts = self._exchange(verb, path, params=params, json_body=json_body, timeout=timeout)
        if 200 <= resp.status_code < 300:
            return self._json(resp) if resp.content else None
        raise self._answer_error(resp, attempts, verb, path)

    def _answer_error(self, resp: requests.Response, attempts: int, verb: str, path: str) -> RelayError:
        """The exception for a REST answer that is not 2xx: its envelope's symbol, else its status's."""
        doc = self._json(resp)
        err = doc.get("error") if isinstance(doc, dict) else None
        if isinstance(err, dict):
            symbol = err.get("code") if isinstance(err.get("code"), str) else None
            return self._make_error(
                resp,
                attempts,
                symbol or _STATUS_SYMBOL.get(resp.status_code),
                None,
                str(err.get("message") or ""),
                err.get("details"),
            )
        return self._make_error(
            resp,
            attempts,
            _STATUS_SYMBOL.get(resp.status_code),
            None,
            f"HTTP {resp.status_code} from {verb} {path}: {resp.text[:200]}",
            None,
        )

    @staticmethod
    def _json(resp: requests.Response) -> Any:
        try:
            return resp.json()
        except ValueError:
            return None

    def _make_error(
        self, resp: requests.Response, attempts: int, symbol: str | None, code: int | None, message: str, data: Any
    ) -> RelayError:
        request_id = resp.headers.get("X-Request-Id")
        if request_id is None and isinstance(data, dict) and isinstance(data.get("request_id"), str):
            request_id = data["request_id"]
        kw: dict[str, Any] = dict(
            symbol=symbol, code=code, data=data, request_id=request_id, http_status=resp.status_code, attempts=attempts
        )
        cls = error_class(symbol)
        if cls is RateLimited:
            retry_after = _retry_after(resp)
            if retry_after is None and isinstance(data, dict) and isinstance(data.get("retry_after"), (int, float)):
                retry_after = float(data["retry_after"])
            return RateLimited(message, retry_after=retry_after, **kw)
        return cls(message, **kw)

    def _exchange(
        self,
        verb: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json_body: Any = None,
        retry_also: Callable[[requests.Response], bool] | None = None,
        timeout: float | tuple[float, float] | None = None,
    ) -> tuple[requests.Response, int]:
        """Make the HTTP request, retrying transient failures; return the last answer and the attempt count.

        The same body (hence the same idempotency key) is sent on every attempt.
        Raises :class:`RelayConnectionError` when no attempt got an answer.
        """
        url = self.base_url + path
        attempt = 0

        def wait(delay: float, reason: str, connection: bool = False) -> None:
            if self.on_retry is not None:
                self.on_retry(RetryNotice(verb, url, attempt, self.max_retries, delay, reason, connection))
            self._sleep(delay)

        while True:
            attempt += 1
            retries_left = attempt <= self.max_retries
            try:
                resp = self.session.request(
                    verb,
                    url,
                    params=params,
                    json=json_body,
                    headers=self._headers(),
                    timeout=self.timeout if timeout is None else timeout,
                    allow_redirects=False,
                )
            except (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError) as exc:
                # ConnectionError covers refused, reset and dropped-before-answer
                # (RemoteDisconnected); requests' pool discards that connection, so the
                # retry opens a fresh one. A refused connect reached nothing: no retry.
                reason = transport_reason(exc)
                if not retries_left or (reason == "connection refused" and not self.retry_refused):
                    raise RelayConnectionError(
                        f"{verb} {url} failed after {attempt} attempt(s): {exc}", reason=reason, attempts=attempt
                    ) from exc
                wait(self._delay(attempt - 1), reason, connection=True)
                continue
            if resp.status_code == 429:
                asked = _retry_after(resp)
                if not retries_left or (asked is not None and asked > self.max_retry_wait):
                    return resp, attempt
                # Retry-After is whole seconds rounded up, so sleeping it is enough; the jitter
                # keeps clients that were refused together from returning together.
                wait(
                    (asked if asked is not None else self._delay(attempt - 1)) + random.uniform(0, self.backoff / 4),
                    "rate limited (HTTP 429)",
                )
                continue
            if resp.status_code >= 500 or (retry_also is not None and retry_also(resp)):
                if not retries_left:
                    return resp, attempt
                reason = f"HTTP {resp.status_code}" if resp.status_code >= 500 else "service unavailable"
                wait(self._delay(attempt - 1), reason)
                continue
            return resp, attempt
