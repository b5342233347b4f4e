"""What relay-agent keeps on disk between runs: the feed position of watch, wait and the hook, and lease tokens."""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator, MutableMapping
from datetime import datetime
from pathlib import Path

import click

from relay.agent.cli.errors import LocalError, OneLineUsage
from relay.agent.client.errors import InvalidParams, RelayError
from relay.agent.client.feed import next_position
from relay.agent.client.models import FeedRow
from relay.agent.client.relay_client import RelayClient

# The feed's oldest possible position, where `watch --from-start` begins.
BEGINNING = "1970-01-01T00:00:00+00:00"


def default_state_file(handle: str, kind: str = "") -> Path:
    """``$XDG_STATE_HOME/relay-agent/<handle>[.kind].json``, else under ``~/.local/state/relay-agent/``.

    ``watch`` and ``wait`` share ``<handle>.json``; ``hook claude-code`` keeps ``<handle>.hook.json``.
    """
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "relay-agent" / f"{handle}{'.' + kind if kind else ''}.json"


def load_state(path: Path) -> dict | None:
    """The saved position, or None if there is none.

    ``{"since": ISO, "seen": [ids at exactly since], "after": message id}``: ``after`` is the
    last message taken (the stream's ``Last-Event-ID``; absent in files written before it
    existed, which then resume from ``since`` and ``seen``).
    """
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise LocalError(f"cannot read the state file {path}: {exc.strerror}", "check its permissions") from None
    try:
        state = json.loads(text)
        datetime.fromisoformat(state["since"])
        if not isinstance(state.get("seen", []), list):
            raise ValueError("seen")
        if not isinstance(state.get("after", ""), str | None):
            raise ValueError("after")
    except (ValueError, KeyError, TypeError):
        raise LocalError(
            f"the state file {path} is not a relay-agent watch state", "delete it to start over, or pass --state-file"
        ) from None
    return state


def save_state(path: Path, state: dict) -> None:
    """Write the state atomically (a crash never leaves half a file)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        with os.fdopen(fd, "w") as out:
            json.dump(state, out, indent=2)
            out.write("\n")
        os.replace(tmp, path)
    except OSError as exc:
        raise LocalError(
            f"cannot write the state file {path}: {exc.strerror}",
            "check the directory's permissions or pass --state-file",
        ) from None


#: a saved lease token older than this is dropped (a lease runs at most 86,400 s; a renew saves it again)
LEASE_KEEP_SECONDS = 2 * 86_400


class LeaseFile(MutableMapping):
    """The lease tokens relay-agent's accepts got, ``task_id -> token``, kept across processes.

    ``$XDG_STATE_HOME/relay-agent/HANDLE.leases.json`` (beside watch's state), private: the
    directory is made 0700 and the file is written 0600. Each entry also records the
    relay's URL (a token is only sent back to the relay that issued it) and when it was
    saved (entries older than LEASE_KEEP_SECONDS are dropped on the next write). Every
    access reads the file again, so two relay-agent processes see each other's tokens; a
    write replaces the file atomically under an advisory lock.
    """

    def __init__(self, client: RelayClient, path: Path | None = None):
        self._client = client
        self._path = path

    @property
    def path(self) -> Path:
        if self._path is None:
            self._path = default_state_file(self._client.handle, "leases")
        return self._path

    def _read(self) -> dict[str, dict]:
        try:
            doc = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise LocalError(
                f"cannot read the lease file {self.path}: {exc.strerror}", "check its permissions"
            ) from None
        except ValueError:
            raise LocalError(
                f"the lease file {self.path} is not JSON", "delete it (saved lease tokens are lost: pass --lease-token)"
            ) from None
        leases = doc.get("leases") if isinstance(doc, dict) else None
        return {
            k: v for k, v in (leases or {}).items() if isinstance(v, dict) and isinstance(v.get("lease_token"), str)
        }

    def _mine(self) -> dict[str, str]:
        return {k: v["lease_token"] for k, v in self._read().items() if v.get("url") == self._client.base_url}

    def _update(self, change: Callable[[dict[str, dict]], None]) -> None:
        path = self.path
        try:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with _locked(path.with_name(path.name + ".lock")):
                leases = self._read()
                change(leases)
                cutoff = time.time() - LEASE_KEEP_SECONDS
                leases = {k: v for k, v in leases.items() if v.get("saved_at", 0) >= cutoff}
                fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # 0600
                with os.fdopen(fd, "w") as out:
                    json.dump({"handle": self._client.handle, "leases": leases}, out, indent=2)
                    out.write("\n")
                os.replace(tmp, path)
        except OSError as exc:
            raise LocalError(
                f"cannot write the lease file {path}: {exc.strerror}", "check the directory's permissions"
            ) from None

    def __getitem__(self, task_id: str) -> str:
        return self._mine()[task_id]

    def __setitem__(self, task_id: str, token: str) -> None:
        entry = {"lease_token": token, "url": self._client.base_url, "saved_at": time.time()}
        self._update(lambda leases: leases.__setitem__(task_id, entry))

    def __delitem__(self, task_id: str) -> None:
        if task_id not in self._mine():
            raise KeyError(task_id)
        self._update(lambda leases: leases.pop(task_id, None))

    def __iter__(self) -> Iterator[str]:
        return iter(self._mine())

    def __len__(self) -> int:
        return len(self._mine())


class _locked:
    """An advisory lock on ``path`` (``fcntl.flock``; nothing where fcntl does not exist)."""

    def __init__(self, path: Path):
        self.path = path
        self.fd: int | None = None

    def __enter__(self) -> None:
        try:
            import fcntl
        except ImportError:  # pragma: no cover (Windows)
            return
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc: object) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing releases the lock


def advance(state: dict, rows: list[FeedRow]) -> dict:
    """The state after ``rows`` (oldest first): next_position's ``since``/``seen``, and the last row as ``after``."""
    since, seen = next_position(rows, state["since"], state.get("seen", []))
    moved = {"after": rows[-1].id} if rows else {}
    return {**state, "since": since, "seen": seen, **moved}


def _position(state: dict) -> dict:
    """The state as RelayClient.wait/stream arguments: ``after`` when it is known, else ``since`` and ``seen``."""
    if state.get("after"):
        return {"after": state["after"]}
    return {"since": state["since"], "seen": state.get("seen", [])}


def _stale_after(exc: RelayError, state: dict) -> bool:
    """The relay no longer knows the saved ``after`` message (its agent was deleted, say): resume from ``since``."""
    fields = exc.data if isinstance(exc.data, dict) else {}
    return (
        isinstance(exc, InvalidParams) and bool(state.get("after")) and ("after" in fields or "Last-Event-ID" in fields)
    )


def _without_after(state: dict) -> dict:
    return {k: v for k, v in state.items() if k != "after"}


def _parse_since(value: str, client: RelayClient) -> dict:
    if value == "now":
        # Skip everything already in the feed: start at its newest row, which is then 'seen'.
        newest = next(iter(client.messages(limit=1)), None)
        if newest is None:
            return {"since": BEGINNING, "seen": []}
        return {
            "since": newest.raw.get("created_at") or newest.created_at.isoformat(),
            "seen": [newest.id],
            "after": newest.id,
        }
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00") if value.endswith("Z") else value)
    except ValueError:
        raise OneLineUsage(f"--since {value}: not an ISO 8601 time (e.g. 2026-04-25T10:00:00Z) or 'now'") from None
    if when.tzinfo is None:
        raise OneLineUsage(f"--since {value}: give a time zone (e.g. 2026-04-25T10:00:00Z)")
    return {"since": when.isoformat(), "seen": []}


def _start_state(client: RelayClient, path: Path, since: str | None, from_start: bool = False) -> dict:
    """Where watch and wait begin: --from-start, else --since, else the saved position,
    else now (a first run skips what is already in the feed: docs/decisions.md)."""
    if from_start:
        if since is not None:
            raise OneLineUsage("--from-start and --since both give the start: give one")
        return {"since": BEGINNING, "seen": []}
    if since is not None:
        return _parse_since(since, client)
    return load_state(path) or _parse_since("now", client)


def _state_file_option(kind: str = "") -> Callable:
    name = f"HANDLE.{kind}.json" if kind else "HANDLE.json"
    return click.option(
        "--state-file",
        type=click.Path(dir_okay=False, path_type=Path),
        metavar="PATH",
        help=f"Where the position is saved (default: $XDG_STATE_HOME/relay-agent/{name}, "
        f"else ~/.local/state/relay-agent/{name}).",
    )
