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


def _nets(*specs: tuple[str, str]) -> tuple[tuple[ipaddress._BaseNetwork, str], ...]:
    return tuple((ipaddress.ip_network(net), reason) for net, reason in specs)


_DOCUMENTATION = "a documentation address"

# Special-purpose ranges (the IANA registries), first match wins. Anything not listed
# must still be ``is_global`` and, for IPv6, global unicast (2000::/3) to be called.
_V4_RANGES = _nets(
    ("0.0.0.0/32", "an unspecified address"),
    ("0.0.0.0/8", "a 'this network' address (0.0.0.0/8)"),
    ("10.0.0.0/8", "a private address"),
    ("100.64.0.0/10", "a shared (carrier-grade NAT) address"),
    ("127.0.0.0/8", "a loopback address"),
    ("169.254.0.0/16", "a link-local (metadata) address"),
    ("172.16.0.0/12", "a private address"),
    ("192.0.0.0/24", "an IETF protocol assignment (192.0.0.0/24)"),
    ("192.0.2.0/24", _DOCUMENTATION),
    ("192.88.99.0/24", "a 6to4 relay anycast address (deprecated)"),
    ("192.168.0.0/16", "a private address"),
    ("198.18.0.0/15", "a benchmarking address"),
    ("198.51.100.0/24", _DOCUMENTATION),
    ("203.0.113.0/24", _DOCUMENTATION),
    ("224.0.0.0/4", "a multicast address"),
    ("255.255.255.255/32", "the broadcast address"),
    ("240.0.0.0/4", "a reserved address"),
)
_V6_RANGES = _nets(
    ("::/128", "an unspecified address"),
    ("::1/128", "a loopback address"),
    ("100::/64", "a discard-only address"),
    ("2001:2::/48", "a benchmarking address"),
    ("2001:db8::/32", _DOCUMENTATION),
    ("2001::/23", "an IETF protocol assignment (2001::/23)"),
    ("3fff::/20", _DOCUMENTATION),
    ("5f00::/16", "an SRv6 segment identifier (5f00::/16)"),
    ("fc00::/7", "a unique-local address"),
    ("fe80::/10", "a link-local address"),
    ("fec0::/10", "a site-local address (deprecated)"),
    ("ff00::/8", "a multicast address"),
)
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")
_GLOBAL_UNICAST = ipaddress.ip_network("2000::/3")


def _low_v4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address:
    return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)


def _embedded(form: str, v4: ipaddress.IPv4Address) -> str | None:
    """The reason for an IPv6 address carrying ``v4``, if ``v4`` itself is refused."""
    reason = _refused_address(v4)
    return f"{form} {reason}, {v4}" if reason else None


def _refused_address(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """Why ``ip`` may not be called, or None if it may: an allow-list of public unicast.

    An IPv6 address that carries an IPv4 address (IPv4-mapped and -compatible, NAT64,
    6to4, Teredo) is judged by the address it carries, since that is where it leads.
    """
    if isinstance(ip, ipaddress.IPv4Address):
        for net, reason in _V4_RANGES:
            if ip in net:
                return reason
        return None if ip.is_global else "a non-global address"
    if ip.ipv4_mapped is not None:
        return _embedded("IPv4-mapped", ip.ipv4_mapped)
    if ip in _NAT64:
        return _embedded("NAT64 of", _low_v4(ip))
    if ip in _NAT64_LOCAL:
        return _embedded("local-use NAT64 of", _low_v4(ip)) or "a local-use NAT64 address (64:ff9b:1::/48)"
    if ip.sixtofour is not None and (reason := _embedded("6to4 of", ip.sixtofour)):
        return reason
    if ip.teredo is not None:
        server, client = ip.teredo
        return (
            _embedded("Teredo with its server at", server)
            or _embedded("Teredo with its client at", client)
            or "a Teredo address (2001::/32)"
        )
    for net, reason in _V6_RANGES:
        if ip in net:
            return reason
    if ip in _IPV4_COMPATIBLE:  # deprecated (RFC 4291); ::a.b.c.d means a.b.c.d to some stacks
        v4 = _low_v4(ip)
        return _embedded("IPv4-compatible", v4) or f"a deprecated IPv4-compatible address ({v4})"
    if ip not in _GLOBAL_UNICAST:
        return "a reserved address"
    return None if ip.is_global else "a non-global address"


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
                f"host {host!r} resolves to {ip} ({reason}); set RELAY_WEBHOOK_ALLOW_PRIVATE=1 to allow such targets"
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
