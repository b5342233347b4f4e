"""gunicorn settings, all from environment variables (Heroku-style)."""

import os

bind = f"{os.environ.get('HOST', '0.0.0.0')}:{os.environ.get('PORT', '8000')}"
workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
# gevent with header, body and idle deadlines: a slow client holds a greenlet, not a
# process (relay/transport/server.py; RELAY_HEADER_TIMEOUT, RELAY_BODY_TIMEOUT,
# RELAY_CLIENT_IDLE_TIMEOUT).
worker_class = "relay.transport.server.RelayWorker"
worker_connections = int(os.environ.get("WEB_CONNECTIONS", "1000"))
timeout = int(os.environ.get("GUNICORN_TIMEOUT", "30"))
graceful_timeout = int(os.environ.get("GUNICORN_GRACEFUL_TIMEOUT", "20"))
keepalive = 5
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
