"""The local platform's settings: one frozen value built by the CLI, read by every route.

Kept apart from the CLI so that the app can be built in-process by code that never
parses arguments, and so that the API key lives in exactly one object that is
never logged (its ``repr`` hides it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class ServerSettings:
    """What ``primeruns serve`` was asked to be.

    ``api_key`` None accepts any bearer (or none); ``train_teams`` None allows
    every team to create external training runs.
    """

    data_dir: Path
    api_key: str | None = field(default=None, repr=False)
    traces_disabled: bool = False
    train_teams: frozenset[str] | None = None
    #: Seconds advertised in ``Retry-After`` on injected 429/503 answers. Small by
    #: default so that tests exercising retries stay fast.
    retry_after: float = 0.1
    #: How long a presigned object-store URL stays valid.
    presign_ttl_seconds: float = 3600.0


@dataclass(frozen=True)
class ConnectionLimits:
    """What ``serve`` bounds per connection (``--head-timeout``,
    ``--body-timeout``, ``--max-connections``; ``slow_clients`` says why)."""

    #: Seconds from waiting for a request to its whole head.
    head_timeout: float = 30.0
    #: Seconds of silence while a request's body is being read; also the
    #: windows over which a body, and an answer waiting on its client, are
    #: held to a least rate (``slow_clients.MIN_RATE``).
    body_timeout: float = 60.0
    #: Connections open at once past which a new one is answered 503; serve
    #: raises its limit on open files for them and its own, or lowers this
    #: where the hard limit holds fewer (``descriptors.fit``).
    max_connections: int = 512
    #: MiB of unfinished request bodies (and of answers waiting on clients
    #: that do not read them) the connections may hold at once, all
    #: told, past which the one whose bytes pass it is answered 503: each of
    #: the bound's connections may otherwise hold a body up to its route's
    #: cap (26 MiB, an object's 512 MiB) for as long as it keeps sending.
    body_memory: int = 1024

    def __post_init__(self) -> None:
        # Each refused by its flag, with what was given, the floor and the
        # default: one refusal naming all three left the user to find which.
        # NaN or an infinity is no limit (a timer that never fires holds a
        # connection), and a deadline under a second answers every client
        # 408 (--head-timeout 1e-9 was taken).
        for name, floor in _FLOORS.items():
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= floor):
                flag = "--" + name.replace("_", "-")
                unit = _UNITS.get(name, "seconds")
                raise ValueError(
                    f"{flag} {value:g} is refused: give a finite number of {unit}, "
                    f"at least {floor:g} (default {getattr(ConnectionLimits, name):g})"
                )


#: The least each of ``ConnectionLimits`` may be: a second for a deadline (a
#: client on a loaded host can take that to send a head), one connection, a MiB.
_FLOORS = {"head_timeout": 1.0, "body_timeout": 1.0, "max_connections": 1, "body_memory": 1}
_UNITS = {"max_connections": "connections", "body_memory": "MiB"}
