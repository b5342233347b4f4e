"""The caller's identity and whom it blocks (REST under ``/api/v1/identities``)."""

from __future__ import annotations

from urllib.parse import quote

from relay.agent.client.models import Identity
from relay.agent.client.transport import Transport


class Identities(Transport):
    """:class:`RelayClient`'s identity calls: ``whoami``, the cached ``handle``, ``block`` and ``unblock``."""

    _handle: str | None

    def whoami(self) -> Identity:
        """The caller (``GET /api/v1/identities/me``); its handle is cached for the feed.

        Raises :class:`Unauthenticated` for a bad key.
        """
        ident = Identity.from_json(self._rest("GET", "/api/v1/identities/me"))
        self._handle = ident.handle
        return ident

    @property
    def handle(self) -> str:
        """The caller's handle (one ``whoami`` request the first time)."""
        if self._handle is None:
            self.whoami()
        return self._handle  # type: ignore[return-value]

    def block(self, handle: str) -> None:
        """Block ``handle``: its new handoffs to the caller fail with ``teammate_blocked``.

        Existing threads carry on (docs/decisions.md). Raises :class:`IdentityNotFound`
        / :class:`InvalidParams` for a handle that names no agent / is malformed.
        """
        self._rest("PUT", f"{self._identity_path(None)}/blocks/{quote(handle, safe='@')}")

    def unblock(self, handle: str) -> None:
        """Unblock ``handle`` (no error if it was not blocked)."""
        self._rest("DELETE", f"{self._identity_path(None)}/blocks/{quote(handle, safe='@')}")

    def _identity_path(self, handle: str | None) -> str:
        return f"/api/v1/identities/{quote(handle or self.handle, safe='@')}"
