"""Each open-mode client's latest session, for ``session_client_header`` (:mod:`proxy.sessions`
ends a client's previous session when it starts a new one)."""

from __future__ import annotations

import hashlib


class ClientSessions:
    """Each client's latest session (``session_client_header``), by a hash of the client's
    header value (a credential is never kept). Entries whose session has ended are dropped at
    each idle sweep, so it holds about one entry per live session."""

    def __init__(self) -> None:
        self._latest: dict[str, str] = {}

    @staticmethod
    def client_of(value: str) -> str:
        return hashlib.sha256(value.encode()).hexdigest()[:32]

    def switch(self, client: str, identity: str) -> str | None:
        """Record ``identity`` as ``client``'s latest session; the one it replaces, if other."""
        previous = self._latest.get(client)
        self._latest[client] = identity
        return previous if previous != identity else None

    def prune(self, live: set[str]) -> None:
        """Forget the clients whose latest session is not in ``live``."""
        self._latest = {c: s for c, s in self._latest.items() if s in live}

    def __len__(self) -> int:
        return len(self._latest)
