"""The tests' own servers: with nothing configured, every test reaches only servers this
session started (embedded, under its temporary folder), never one already on the machine."""

from __future__ import annotations

import os

import psycopg2
import pytest
import redis
from sqlalchemy.engine import make_url

from relay.ops import embedded
from tests.conftest import _TMP, connect, session_environment

CONFIGURED = bool(os.environ.get("DATABASE_URL") or os.environ.get("REDIS_URL"))


@pytest.mark.skipif(CONFIGURED, reason="DATABASE_URL or REDIS_URL is set: the session uses those servers")
def test_with_nothing_configured_the_session_servers_are_its_own_embedded_ones_over_tcp(server_urls):
    db_url, redis_url = server_urls
    db = make_url(db_url)
    assert (db.host, db.port is not None) == ("127.0.0.1", True), db_url
    conn = connect(db_url)
    try:
        with conn.cursor() as cur:
            cur.execute("SHOW data_directory")
            data_directory = cur.fetchone()[0]
            cur.execute("SELECT inet_server_addr()::text, inet_server_port()")
            address = cur.fetchone()
    finally:
        conn.close()
    assert data_directory.startswith(str(_TMP)), data_directory
    assert address == ("127.0.0.1/32", db.port), address
    client = redis.Redis.from_url(redis_url)
    try:
        redis_dir = client.config_get("dir")["dir"]
    finally:
        client.close()
    assert redis_dir.startswith(str(_TMP)), redis_dir


def test_the_embedded_postgresql_listens_on_a_free_loopback_port_as_well_as_its_socket_when_asked(tmp_path):
    """relay.ops.embedded.start_postgres(tcp=True): the URL is 127.0.0.1 and a port chosen at
    start, and the socket in the data directory still answers on that port."""
    server, url = embedded.start_postgres(tmp_path, tcp=True)
    try:
        parsed = make_url(url)
        assert (parsed.host, parsed.database) == ("127.0.0.1", "relay"), url
        info = server.get_postmaster_info()
        assert parsed.port == info.port, (url, info)
        for host in ("127.0.0.1", str(info.socket_dir)):
            conn = psycopg2.connect(host=host, port=info.port, user="postgres", dbname="relay", connect_timeout=10)
            try:
                with conn.cursor() as cur:
                    cur.execute("SELECT current_database(), inet_server_addr() IS NOT NULL")
                    assert cur.fetchone() == ("relay", host == "127.0.0.1"), host
            finally:
                conn.close()
    finally:
        server.cleanup()


def test_the_embedded_postgresql_listens_on_its_socket_only_by_default(tmp_path):
    """relay up's default: no TCP listener, the URL a socket one."""
    server, url = embedded.start_postgres(tmp_path)
    try:
        info = server.get_postmaster_info()
        assert make_url(url).host is None and info.hostname is None, (url, info)
        conn = connect(url)
        conn.close()
    finally:
        server.cleanup()


def test_the_session_environment_leaves_the_runners_relay_home_alone(server_urls):
    """A RELAY_HOME exported for the runner's relay up never reaches what the tests start."""
    runner = {**os.environ, "RELAY_HOME": "/home/someone/project/.relay"}
    env = session_environment(runner, server_urls[0], server_urls[1], None)
    assert "RELAY_HOME" not in env
