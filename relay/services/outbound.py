"""Outbound webhook HTTP with SSRF protection (docs/webhooks.md, "Endpoints").

The target host is resolved once, every address is checked, and the connection goes
to the address that was checked — there is no second DNS lookup between check and
connect. Redirects are never followed.
"""

from __future__ import annotations

import base64
import http.client
import ipaddress
import secrets
import socket
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

import urllib3
from flask import current_app

from relay.agent.retry_after import parse_retry_after
from relay.errors import invalid
from relay.urls import BadUrl, parse_web_url

EVENT_TYPES = ("message.created", "task.updated", "message.read")
# What an endpoint hears when it names no events: message.read (a read receipt)
# is opt-in, as it fires on every read that moves a position.
DEFAULT_EVENTS = ("message.created", "task.updated")
USER_AGENT = "handoff-relay-webhooks/1.0"
MAX_RESPONSE_BYTES = 64 * 1024
DEADLINE_GRACE = 1.0  # seconds past the timeout before the watchdog cuts a trickling receiver


class TargetRefused(ValueError):
    """The URL may not be called; the message says why.

    ``kind`` is ``dns`` when the host does not resolve, ``refused`` when the URL or an
    address it resolves to is not allowed.
    """

    def __init__(self, message: str, kind: str = "refused"):
        super().__init__(message)
        self.kind = kind


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
    """Parse, resolve and check a webhook URL; raise TargetRefused saying which rule refused it.

    The URL rule first (``relay.urls.parse_web_url``: malformed, or a scheme other than
    http and https), then what may be called: plain http only with ``allow_http``
    (RELAY_WEBHOOK_ALLOW_HTTP), no credentials, and every address the host resolves to
    public unless ``allow_private`` (RELAY_WEBHOOK_ALLOW_PRIVATE). A host that does not
    resolve is ``kind="dns"``.
    """
    try:
        parsed = parse_web_url(url)
    except BadUrl as exc:
        raise TargetRefused(str(exc)) from None
    if parsed.scheme == "http" and not allow_http:
        raise TargetRefused("plain http is not allowed: must use https (set RELAY_WEBHOOK_ALLOW_HTTP=1 to allow http)")
    if parsed.credentials:
        raise TargetRefused("must not carry credentials (user:password@)")
    host, port = parsed.host, parsed.port
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise TargetRefused(f"host {host!r} does not resolve", "dns") from None
    addresses = []
    for info in infos:
        ip = ipaddress.ip_address(info[4][0].split("%", 1)[0])
        reason = _refused_address(ip)
        if reason and not allow_private:
            raise TargetRefused(
                f"host {host!r} resolves to {ip} ({reason}): private, loopback and other non-public "
                "addresses are not allowed; set RELAY_WEBHOOK_ALLOW_PRIVATE=1 to allow such targets"
            )
        addresses.append(str(ip))
    if not addresses:
        raise TargetRefused(f"host {host!r} does not resolve", "dns")
    return Target(parsed.scheme, host, port, parsed.target, addresses[0])


@dataclass(frozen=True)
class Outcome:
    """One attempt's result: ``status`` (None when no response), ``error`` (None on a response),
    ``retry_after`` (seconds, from the header), ``duration_ms`` (real, from start to end)."""

    status: int | None
    error: str | None
    retry_after: int | None
    duration_ms: int


class TargetCache:
    """Checked targets by URL, kept ``ttl`` seconds (getaddrinfo gives no TTL, so a short fixed one).

    Every resolution, first or renewed, goes through :func:`resolve` and its address checks:
    a name that starts pointing at a private address is refused at its next renewal.
    Thread-safe; at most ``size`` URLs (the oldest go first).
    """

    def __init__(self, ttl: float = 30.0, size: int = 4096):
        self.ttl, self.size = ttl, size
        self._entries: OrderedDict[tuple, tuple[float, Target]] = OrderedDict()
        self._lock = threading.Lock()

    def resolve(self, url: str, *, allow_private: bool, allow_http: bool) -> Target:
        """The checked target of ``url`` (cached); raise TargetRefused like :func:`resolve`."""
        key = (url, allow_private, allow_http)
        now = time.monotonic()
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry[0] > now:
                return entry[1]
        target = resolve(url, allow_private=allow_private, allow_http=allow_http)
        with self._lock:
            self._entries[key] = (now + self.ttl, target)
            self._entries.move_to_end(key)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)
        return target


_attempt = threading.local()


class _DeadlineMixin:
    """Remember, per thread, the connection a request went out on, so a watchdog can cut it."""

    def request(self, *args, **kwargs):
        box = getattr(_attempt, "box", None)
        if box is not None:
            box.append(self)
        return super().request(*args, **kwargs)


class _HTTPConnection(_DeadlineMixin, urllib3.connection.HTTPConnection):
    pass


class _HTTPSConnection(_DeadlineMixin, urllib3.connection.HTTPSConnection):
    pass


def _cut(conn) -> None:
    sock = getattr(conn, "sock", None)
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


class Sender:
    """POSTs webhooks over kept-alive connections, one pool per (scheme, checked address, port, host).

    The pool connects to the address that was checked, never to the name (no second DNS
    lookup between check and connect); TLS still verifies the certificate for the name.
    ``per_pool`` connections at most per pool (the endpoint concurrency cap); at most
    ``pools`` pools are kept, the least recently used closed first. Thread-safe.
    """

    def __init__(self, per_pool: int = 4, pools: int = 512):
        self.per_pool, self.max_pools = per_pool, pools
        self._pools: OrderedDict[tuple, urllib3.HTTPConnectionPool] = OrderedDict()
        self._lock = threading.Lock()

    def _pool(self, target: Target, timeout: float) -> urllib3.HTTPConnectionPool:
        key = (target.scheme, target.address, target.port, target.host)
        with self._lock:
            pool = self._pools.get(key)
            if pool is not None:
                self._pools.move_to_end(key)
                return pool
            kwargs = {}
            if target.scheme == "https":
                pool_cls = urllib3.HTTPSConnectionPool
                kwargs = {"server_hostname": target.host, "assert_hostname": target.host, "cert_reqs": "CERT_REQUIRED"}
            else:
                pool_cls = urllib3.HTTPConnectionPool
            pool = pool_cls(
                target.address,
                target.port,
                timeout=urllib3.Timeout(total=timeout),
                retries=False,
                maxsize=self.per_pool,
                block=False,
                **kwargs,
            )
            # urllib3's timeout bounds each socket read; a receiver trickling a byte at a
            # time would keep an attempt alive past it. The watchdog in post() cuts it.
            pool.ConnectionCls = _HTTPSConnection if target.scheme == "https" else _HTTPConnection
            self._pools[key] = pool
            while len(self._pools) > self.max_pools:
                _key, old = self._pools.popitem(last=False)
                old.close()
            return pool

    def close(self) -> None:
        """Close every kept connection."""
        with self._lock:
            pools, self._pools = list(self._pools.values()), OrderedDict()
        for pool in pools:
            pool.close()

    def post(self, target: Target, body: bytes, headers: dict[str, str], timeout: float) -> Outcome:
        """POST ``body`` to the checked address of ``target``; never follow a redirect.

        Errors are named for what they are: ``connection refused``, ``TLS failure``,
        ``timeout after N s (connecting | waiting for the response)``, ``connection
        closed``; a response of any status is an Outcome with that status.
        """
        default_port = 443 if target.scheme == "https" else 80
        host = f"[{target.host}]" if ":" in target.host and not target.host.startswith("[") else target.host
        host_header = host if target.port == default_port else f"{host}:{target.port}"
        all_headers = {"Host": host_header, "User-Agent": USER_AGENT, "Content-Type": "application/json", **headers}
        started = time.monotonic()
        box: list = []  # the connection this attempt goes out on (see _DeadlineMixin)
        fired = threading.Event()

        def watchdog() -> None:
            fired.set()
            for conn in box:
                _cut(conn)

        # A grace second past the read timeout, so a plain slow answer is reported as that.
        timer = threading.Timer(timeout + DEADLINE_GRACE, watchdog)
        timer.daemon = True
        _attempt.box = box
        timer.start()
        try:
            response = self._pool(target, timeout).urlopen(
                "POST",
                target.path,
                body=body,
                headers=all_headers,
                redirect=False,
                retries=False,
                preload_content=False,
                assert_same_host=False,
                timeout=urllib3.Timeout(total=timeout),
            )
            try:
                # Read (a bounded part of) the answer so the connection can be reused.
                response.read(MAX_RESPONSE_BYTES)
            finally:
                response.release_conn()
            retry_after = parse_retry_after(response.headers.get("Retry-After"))
            if fired.is_set():
                raise urllib3.exceptions.ReadTimeoutError(None, target.path, "deadline")
            return Outcome(response.status, None, retry_after, _ms(started))
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            if fired.is_set():
                # The watchdog cut a receiver that kept the attempt alive past the deadline.
                return Outcome(None, f"timeout after {timeout:g} s (the whole attempt)", None, _ms(started))
            return Outcome(None, describe_error(exc, timeout), None, _ms(started))
        finally:
            timer.cancel()
            _attempt.box = None


def _ms(started: float) -> int:
    return int((time.monotonic() - started) * 1000)


def describe_error(exc: Exception, timeout: float) -> str:
    """What went wrong with an attempt that got no response, in words (case: refused was logged as a timeout)."""
    # NewConnectionError subclasses ConnectTimeoutError (urllib3 2.x): test it first.
    if isinstance(exc, urllib3.exceptions.NewConnectionError):
        cause = exc.__cause__ or exc.__context__
        if isinstance(cause, ConnectionRefusedError) or "refused" in str(exc).lower():
            return "connection refused"
        if isinstance(cause, TimeoutError | socket.timeout):
            return f"timeout after {timeout:g} s (connecting)"
        return f"connection failed: {cause or exc}"
    if isinstance(exc, urllib3.exceptions.ConnectTimeoutError):
        return f"timeout after {timeout:g} s (connecting)"
    if isinstance(exc, urllib3.exceptions.ReadTimeoutError):
        return f"timeout after {timeout:g} s (waiting for the response)"
    if isinstance(exc, urllib3.exceptions.SSLError):
        return f"TLS failure: {exc.__cause__ or exc}"
    if isinstance(exc, urllib3.exceptions.IncompleteRead | http.client.IncompleteRead):
        return "connection closed mid-response"
    if isinstance(exc, urllib3.exceptions.ProtocolError):
        cause = exc.args[1] if len(exc.args) > 1 else exc
        if isinstance(cause, http.client.BadStatusLine | http.client.LineTooLong):
            return "malformed response: not an HTTP status line"
        if isinstance(cause, http.client.IncompleteRead):
            return "connection closed mid-response"
        return f"connection closed: {type(cause).__name__}"
    return f"{type(exc).__name__}: {exc}"


def post(target: Target, body: bytes, headers: dict[str, str], timeout: float) -> Outcome:
    """POST once over a new connection (see :meth:`Sender.post`)."""
    sender = Sender(per_pool=1, pools=1)
    try:
        return sender.post(target, body, headers, timeout)
    finally:
        sender.close()


def new_secret() -> str:
    """Return a Standard Webhooks secret: ``whsec_`` + base64 of 32 random bytes."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode("ascii")


def check_url(url: str, *, unresolved_ok: bool = False) -> str:
    """Refuse URLs that may not be called (scheme, credentials, private targets); return it.

    Raises invalid_params naming ``url``. A host that does not resolve is refused too,
    unless ``unresolved_ok``: then it is taken, and every delivery resolves and checks it
    again (``TargetCache``), recording a DNS failure and retrying while it does not resolve.
    A host that resolves to a refused address is refused either way.
    """
    if not isinstance(url, str) or not url or len(url) > 2048:
        raise invalid("url", "must be a URL of at most 2048 characters")
    s = current_app.config["RELAY"]
    try:
        resolve(url, allow_private=s.webhook_allow_private, allow_http=s.webhook_allow_http)
    except TargetRefused as exc:
        if not (unresolved_ok and exc.kind == "dns"):
            raise invalid("url", str(exc)) from None
    return url
