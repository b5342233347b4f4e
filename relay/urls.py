"""Web URLs: the one rule for every http(s) URL the relay takes (artifact links, webhooks, push configs).

A URL is split by ``urllib.parse`` (RFC 3986) and its host checked the way resolvers and
browsers (the WHATWG URL standard) read it, so every URL a browser would open is taken:

- the scheme is ``http`` or ``https`` (any case);
- the host is a name of dot-separated labels of ASCII letters, digits, ``-`` and ``_``
  (one label, ``localhost``, and one-letter top labels, ``a.b``, included; a trailing dot
  allowed), or of Unicode labels (IDNA 2008 with UTS #46 mapping, by the ``idna`` package),
  or an IPv4 address in any spelling ``inet_aton`` reads (``127.1``, ``0x7f.0.0.1``), or an
  IPv6 literal in brackets;
- the port, when given, is 1-65535;
- nothing in it is a space or a control character (percent-encode them).

What may be *called* (plain http, credentials, private and loopback addresses) is the
outbound side's rule on top of this one: ``relay.services.outbound.resolve``.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

import idna

SCHEMES = ("http", "https")
#: For OpenAPI documents: what a field holding such a URL starts with (the scheme in any case).
URL_PATTERN = "^[Hh][Tt][Tt][Pp][Ss]?://"
MAX_HOST = 253  # characters of a name in ASCII (RFC 1035), without its trailing dot
MAX_LABEL = 63

_ASCII_LABEL = re.compile(r"[a-z0-9_-]{1,63}")
# A last label that is a number makes the host an IPv4 address (WHATWG "ends in a number").
_NUMBER = re.compile(r"(?:0x[0-9a-f]*|[0-9]+)")
_SPACE_OR_CONTROL = re.compile(r"[\x00-\x20\x7f-\x9f]")


class BadUrl(ValueError):
    """A URL this rule refuses. ``rule`` says which: ``malformed`` or ``scheme``; the message says why.

    The message is a reason a field error can hold as it is (``scheme 'ftp' is not
    allowed (only http and https)``).
    """

    def __init__(self, rule: str, message: str):
        super().__init__(message)
        self.rule = rule


@dataclass(frozen=True)
class ParsedUrl:
    """An http(s) URL, parsed.

    ``scheme``: ``http`` or ``https``. ``host``: what to resolve and name in ``Host`` and
    TLS: a name lower-cased with IDN labels as their ASCII A-labels (``xn--...``), an IPv4
    address as written, or an IPv6 address without its brackets. ``port``: the one given,
    else 80 or 443. ``target``: the path (at least ``/``) and ``?query``; the fragment is
    never sent. ``credentials``: whether it carries ``user[:password]@``.
    """

    scheme: str
    host: str
    port: int
    target: str
    credentials: bool


def _malformed(reason: str) -> BadUrl:
    return BadUrl("malformed", f"is not a valid URL: {reason}")


def _ipv6(host: str) -> str:
    # RFC 6874 writes a zone id's "%" as "%25"; ipaddress reads the zone after a plain "%".
    text = host.replace("%25", "%", 1)
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        raise _malformed(f"host [{host}] is not an IPv6 address") from None
    return host


def _ipv4(host: str) -> str:
    try:
        socket.inet_aton(host.removesuffix("."))
    except OSError:
        raise _malformed(f"host {host!r} ends in a number, so it must be an IPv4 address, and it is not one") from None
    return host


def _name(host: str) -> str:
    labels = host.removesuffix(".").split(".")
    ascii_labels = []
    for label in labels:
        if not label:
            raise _malformed(f"host {host!r} has an empty label (two dots in a row, or a leading dot)")
        if label.isascii():
            if not _ASCII_LABEL.fullmatch(label):
                if len(label) > MAX_LABEL:
                    raise _malformed(f"host label {label[:20]!r}... is longer than {MAX_LABEL} characters")
                raise _malformed(f"host {host!r} may hold only letters, digits, '-', '_' and '.'")
            if label.startswith("xn--"):
                try:
                    idna.decode(label)
                except idna.IDNAError as exc:
                    raise _malformed(f"host label {label!r} is not a valid IDN A-label ({exc})") from None
            ascii_labels.append(label)
            continue
        try:
            ascii_labels.append(idna.encode(label, uts46=True).decode("ascii"))
        except (idna.IDNAError, UnicodeError) as exc:
            raise _malformed(f"host label {label!r} is not a valid internationalised name ({exc})") from None
    name = ".".join(ascii_labels)
    if len(name) > MAX_HOST:
        raise _malformed(f"host is {len(name)} characters in ASCII, more than {MAX_HOST}")
    return name + ("." if host.endswith(".") else "")


def parse_web_url(url: str) -> ParsedUrl:
    """Parse ``url`` as an http(s) URL; raise BadUrl naming the rule it breaks.

    Rules, in order: a string with no space or control character; a scheme of http or
    https (``scheme``); a host; a port of 1-65535; a host that is a valid name, IPv4 or
    bracketed IPv6 address (all ``malformed``). Resolves nothing.
    """
    if not isinstance(url, str) or not url:
        raise _malformed("must be a non-empty string")
    if _SPACE_OR_CONTROL.search(url):
        # urlsplit drops tabs and newlines, so the URL checked would not be the URL stored.
        raise _malformed("it holds a space or a control character (percent-encode it)")
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise _malformed(str(exc)) from None
    scheme = parts.scheme.lower()
    if not scheme:
        raise _malformed("it has no scheme (start it with https://)")
    if scheme not in SCHEMES:
        raise BadUrl("scheme", f"scheme {scheme!r} is not allowed (only http and https)")
    hostport = parts.netloc.rpartition("@")[2]
    host = parts.hostname or ""
    if not host:
        raise _malformed(f"it has no host (write {scheme}://host/...)")
    try:
        port = parts.port
    except ValueError:
        raise _malformed("the port must be a number 1-65535") from None
    if port == 0:
        raise _malformed("the port must be a number 1-65535")
    if hostport.startswith("["):
        host = _ipv6(host)
    elif _NUMBER.fullmatch(host.removesuffix(".").rpartition(".")[2]):
        host = _ipv4(host)
    else:
        host = _name(host)
    target = parts.path or "/"
    if parts.query:
        target += "?" + parts.query
    return ParsedUrl(
        scheme=scheme,
        host=host,
        port=port or (443 if scheme == "https" else 80),
        target=target,
        credentials="@" in parts.netloc,
    )
