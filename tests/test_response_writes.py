"""How the web worker puts an answer on the wire (relay.transport.server.OneWriteResponse).

The response writes into one end of a ``SOCK_SEQPACKET`` socket pair, which keeps each
``send`` a separate packet, so the reader sees how many writes an answer took.
"""

from __future__ import annotations

import socket

import pytest
from gunicorn.config import Config
from gunicorn.http.parser import RequestParser

from relay.transport.server import OneWriteResponse


def _exchange(request: bytes, headers: list[tuple[str, str]], chunks: list[bytes]) -> list[bytes]:
    """Answer ``request`` with ``headers`` and ``chunks``; return the packets the client got."""
    cfg = Config()
    req = next(iter(RequestParser(cfg, [request], ("127.0.0.1", 50000))))
    server, client = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        resp = OneWriteResponse(req, server, cfg)
        resp.start_response("200 OK", headers)
        for chunk in chunks:
            resp.write(chunk)
        resp.close()
        server.close()
        packets = []
        while packet := client.recv(1 << 20):
            packets.append(packet)
        return packets
    finally:
        client.close()


GET = b"GET /api/v1/x HTTP/1.1\r\nHost: relay\r\n\r\n"


def test_a_json_answer_of_known_length_leaves_in_one_write():
    body = b'{"jsonrpc": "2.0", "id": 1, "result": {"ok": true}}'
    packets = _exchange(GET, [("Content-Type", "application/json"), ("Content-Length", str(len(body)))], [body])
    assert len(packets) == 1
    head, _, rest = packets[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"\r\nContent-Length: " + str(len(body)).encode() in head
    assert b"\r\nConnection: keep-alive" in head
    assert rest == body


@pytest.mark.parametrize(
    ("headers", "chunks"),
    [
        # a stream: no length, so chunked, head first and each chunk after
        ([("Content-Type", "text/event-stream")], [b"data: 1\n\n", b"data: 2\n\n"]),
        # a length split over two chunks
        ([("Content-Length", "6")], [b"abc", b"def"]),
    ],
)
def test_other_answers_keep_gunicorns_framing(headers, chunks):
    packets = _exchange(GET, headers, chunks)
    assert len(packets) > 1
    assert packets[0].endswith(b"\r\n\r\n")  # the head alone
    assert b"".join(packets).count(b"HTTP/1.1 200 OK") == 1
    if ("Content-Length", "6") in headers:
        assert b"".join(packets).endswith(b"\r\n\r\nabcdef")
    else:
        assert b"".join(packets).endswith(b"0\r\n\r\n")  # the chunked stream's end
