"""Outbound webhook HTTP with SSRF protection (DESIGN.md, "Events, webhooks"; case C12).

The target host is resolved once, every address is checked, and the connection goes
to the address that was checked — there is no second DNS lookup between check and
connect. Redirects are never followed.
"""

from __future__ import annotations

import base64
import ipaddress
import secrets
import socket
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import urllib3
from flask import current_app

from relay.errors import invalid

EVENT_TYPES = ("message.created", "task.updated")
USER_AGENT = "handoff-relay-webhooks/1.0"
MAX_RESPONSE_BYTES = 64 * 1024


class TargetRefused(ValueError):
    """The URL may not be called; the message says why."""


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str
    port: int
    path: str
    address: str


def _refused_address(ip: ipaddress._BaseAddress) -> str | None:
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        reason = _refused_address(ip.ipv4_mapped)
        return f"IPv4-mapped {reason}" if reason else None
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_link_local:
        return "a link-local (metadata) address"
    if ip.is_multicast:
        return "a multicast address"
    if ip.is_unspecified:
        return "an unspecified address"
    if ip.is_reserved:
        return "a reserved address"
    if ip.is_private or not ip.is_global:
        return "a private address"
    return None


def resolve(url: str, *, allow_private: bool, allow_http: bool) -> Target:
    """Parse, resolve and check a webhook URL; raise TargetRefused saying why it may not be called."""
    if any(ord(c) <= 0x20 or ord(c) == 0x7F for c in url):
        # urlsplit drops tabs and newlines, so the URL checked would not be the URL stored.
        raise TargetRefused("must not contain spaces or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise TargetRefused(f"is not a valid URL ({exc})") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https"):
        raise TargetRefused("must use https (or http where allowed)")
    if scheme == "http" and not allow_http:
        raise TargetRefused("must use https (set RELAY_WEBHOOK_ALLOW_HTTP=1 to allow http)")
    if parts.username is not None or parts.password is not None:
        raise TargetRefused("must not carry credentials")
    host = parts.hostname
    if not host:
        raise TargetRefused("has no host")
    port = port or (443 if scheme == "https" else 80)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise TargetRefused(f"host {host!r} does not resolve") from None
    addresses = []
    for info in infos:
        ip = ipaddress.ip_address(info[4][0].split("%", 1)[0])
        reason = _refused_address(ip)
        if reason and not allow_private:
            raise TargetRefused(
                f"host {host!r} resolves to {reason} ({ip}); set RELAY_WEBHOOK_ALLOW_PRIVATE=1 to allow such targets"
            )
        addresses.append(str(ip))
    if not addresses:
        raise TargetRefused(f"host {host!r} does not resolve")
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    return Target(scheme, host, port, path, addresses[0])


@dataclass(frozen=True)
class Outcome:
    status: int | None
    error: str | None
    retry_after: int | None
    duration_ms: int


def post(target: Target, body: bytes, headers: dict[str, str], timeout: float) -> Outcome:
    """POST ``body`` to the checked address of ``target``; never follow a redirect."""
    default_port = 443 if target.scheme == "https" else 80
    host_header = target.host if target.port == default_port else f"{target.host}:{target.port}"
    if ":" in target.host and not target.host.startswith("["):
        host_header = f"[{target.host}]" if target.port == default_port else f"[{target.host}]:{target.port}"
    all_headers = {"Host": host_header, "User-Agent": USER_AGENT, "Content-Type": "application/json", **headers}
    kwargs = {}
    if target.scheme == "https":
        pool_cls = urllib3.HTTPSConnectionPool
        kwargs = {"server_hostname": target.host, "assert_hostname": target.host, "cert_reqs": "CERT_REQUIRED"}
    else:
        pool_cls = urllib3.HTTPConnectionPool
    started = time.monotonic()
    pool = pool_cls(
        target.address, target.port, timeout=urllib3.Timeout(total=timeout), retries=False, maxsize=1, **kwargs
    )
    try:
        response = pool.urlopen(
            "POST",
            target.path,
            body=body,
            headers=all_headers,
            redirect=False,
            retries=False,
            preload_content=False,
            assert_same_host=False,
        )
        try:
            response.read(MAX_RESPONSE_BYTES)
        finally:
            response.release_conn()
        retry_after = None
        raw = response.headers.get("Retry-After")
        if raw and raw.strip().isdigit():
            retry_after = int(raw.strip())
        return Outcome(response.status, None, retry_after, int((time.monotonic() - started) * 1000))
    except urllib3.exceptions.HTTPError as exc:
        reason = type(exc).__name__
        if isinstance(exc, (urllib3.exceptions.TimeoutError,)):
            reason = f"timeout after {timeout} s"
        return Outcome(None, reason, None, int((time.monotonic() - started) * 1000))
    finally:
        pool.close()


def new_secret() -> str:
    """Return a Standard Webhooks secret: ``whsec_`` + base64 of 32 random bytes."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode("ascii")


def check_url(url: str) -> str:
    """Refuse URLs that may not be called (scheme, credentials, private targets); return it."""
    if not isinstance(url, str) or not url or len(url) > 2048:
        raise invalid("url", "must be a URL of at most 2048 characters")
    s = current_app.config["RELAY"]
    try:
        resolve(url, allow_private=s.webhook_allow_private, allow_http=s.webhook_allow_http)
    except TargetRefused as exc:
        raise invalid("url", str(exc)) from None
    return url
