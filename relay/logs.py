"""Logging for every process (web, worker, beat, CLI): one JSON object per line on stdout."""

from __future__ import annotations

import logging
import sys

from pythonjsonlogger.json import JsonFormatter

_configured = False


class _StdoutHandler(logging.StreamHandler):
    """Write to whatever ``sys.stdout`` is at emit time (test runners swap and close it)."""

    @property
    def stream(self):
        return sys.stdout

    @stream.setter
    def stream(self, value):
        pass


def configure_logging(level: str = "INFO") -> None:
    """Send every log record to stdout as one JSON object (idempotent)."""
    global _configured
    if _configured:
        return
    handler = _StdoutHandler()
    handler.setFormatter(
        JsonFormatter(
            "%(asctime)s %(levelname)s %(name)s %(message)s",
            rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("flask-limiter").addFilter(_one_line_fail_open)
    _configured = True


def _one_line_fail_open(record: logging.LogRecord) -> bool:
    """Shorten flask-limiter's fail-open traceback (Redis down) to one line naming the error."""
    if record.exc_info and record.exc_info[1] is not None:
        record.msg = f"{record.getMessage()}: rate limiting fails open ({type(record.exc_info[1]).__name__}: {record.exc_info[1]})"
        record.args = None
        record.exc_info = None
        record.exc_text = None
    return True
