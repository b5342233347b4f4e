"""gunicorn settings, all from environment variables (Heroku-style)."""

import os
import resource

from relay.config import ConfigError, process_integer, web_host


def _checked(read, name: str):
    try:
        return read(os.environ, name) if name else read(os.environ)
    except ConfigError as exc:
        # One line naming the variable, not a traceback; gunicorn stops.
        raise SystemExit(f"relay: configuration error: {exc}") from None


def _int(name: str) -> int:
    return _checked(process_integer, name)


_host = _checked(web_host, "")
bind = f"[{_host}]:{_int('PORT')}" if ":" in _host else f"{_host}:{_int('PORT')}"
workers = _int("WEB_CONCURRENCY")
# gevent with header, body and idle deadlines: a slow client holds a greenlet, not a
# process (relay/transport/server.py; RELAY_HEADER_TIMEOUT, RELAY_BODY_TIMEOUT,
# RELAY_CLIENT_IDLE_TIMEOUT). Feed waits and streams hold a greenlet each too: `python -m
# bench wake` held 500 at 105 MiB a worker, and gthread with 300 threads took more CPU and
# memory for the same wake latency (docs/performance.md).
worker_class = "relay.transport.server.RelayWorker"
worker_connections = _int("WEB_CONNECTIONS")


def _open_files_for(connections: int) -> None:
    """Raise this process's open-file limit (workers inherit it) to fit ``connections`` sockets.

    Each held connection (a long-poll or a stream waiting for a wake-up) is a file
    descriptor; many systems start processes with a soft limit of 1,024. The soft limit
    goes up to what the connections need plus room for the pools and logs, never past the
    hard limit, which only the system can raise (docs/operations.md, "Many waiting agents").
    """
    want = connections + 256
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < want:
        ceiling = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (ceiling, hard))
        if ceiling < want:
            print(
                f"relay: open files are limited to {ceiling} (hard limit), below the {want} that "
                f"WEB_CONNECTIONS={connections} needs; raise the hard limit (ulimit -Hn) or lower WEB_CONNECTIONS",
                flush=True,
            )


_open_files_for(worker_connections)
timeout = _int("GUNICORN_TIMEOUT")
graceful_timeout = _int("GUNICORN_GRACEFUL_TIMEOUT")
# Seconds an idle kept-alive connection waits for its next request. Longer than the idle
# timeouts in front of it (AWS ALB and nginx 60 s, Heroku's router 55 s) so those close
# first: a proxy that reuses a connection the server closed at the same moment answers 502.
keepalive = _int("GUNICORN_KEEPALIVE")
# Behind Heroku's router (or any proxy) set FORWARDED_ALLOW_IPS='*' so X-Forwarded-* is trusted.
forwarded_allow_ips = os.environ.get("FORWARDED_ALLOW_IPS", "127.0.0.1")
# The app writes one JSON line per request (relay.request); gunicorn's own access log
# would repeat it, so it is off unless asked for.
accesslog = os.environ.get("GUNICORN_ACCESSLOG") or None
access_log_format = '{"remote": "%(h)s", "status": %(s)s, "method": "%(m)s", "path": "%(U)s", "duration_us": %(D)s, "request_id": "%({x-request-id}o)s"}'
# gunicorn's control socket lives at one path per user, so two web processes on one
# host (relay up beside a test, two dynos on a laptop) would fight over it.
control_socket_disable = True
# A feed search of 500 CJK characters URL-encodes to ~4.5 kB; gunicorn's default request
# line limit (4094) would answer it with an HTML 414 before the app could.
limit_request_line = 8190


def post_fork(server, worker):
    """Move what the worker imported out of the collector's sight, and collect the young less often.

    A page of the feed or a large tasks/get builds thousands of short-lived objects; with
    the default threshold (700) the young generation was collected several times a request
    and full collections walked every module's objects (the scale bench saw 100 ms pauses
    in tasks/get of a 1,000-message thread). Refcounting still frees almost everything.
    """
    import gc

    gc.freeze()
    gc.set_threshold(10_000, 20, 20)
