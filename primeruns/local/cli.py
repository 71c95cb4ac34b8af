"""``primeruns serve``: run the local platform under uvicorn until SIGTERM/SIGINT.

Prints ``primeruns serve: listening on http://HOST:PORT`` (flushed) once the
socket accepts connections, so a parent that asked for ``--port 0`` can read
the port. The API key comes from ``$PRIMERUNS_LOCAL_API_KEY``, never the
command line (``ps`` shows that to every user of the machine: ``--api-key``
is refused, and the refusal does not repeat it); it is never printed. With a
key, a one-time dashboard login link follows (``primeruns serve: dashboard
login (once): URL``). Binding beyond loopback needs a key (or
``--allow-remote-without-key``): see ``guard.py`` for what is checked.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from . import descriptors
from .settings import ConnectionLimits

if TYPE_CHECKING:
    from starlette.applications import Starlette

API_KEY_ENV = "PRIMERUNS_LOCAL_API_KEY"
#: Seconds SIGTERM waits for requests in flight before cancelling them.
SHUTDOWN_GRACE_S = 2
#: Where the platform stores what it is sent without ``--data``: in the
#: current directory, and the path is said at start (a folder appearing
#: silently wherever serve was started surprised users).
DEFAULT_DATA = "primeruns-local-data"


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8765, help="port (0 picks a free one)")
    parser.add_argument(
        "--data",
        type=Path,
        default=None,
        metavar="DIR",
        help=f"directory holding the SQLite database and the object store "
        f"(default ./{DEFAULT_DATA}; where it is, is said at start)",
    )
    parser.add_argument(
        "--runs-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="serve only the dashboard, read-only, from the run journals under DIR "
        "(offline runs, before primeruns sync); no platform API, --data is not used",
    )
    # Refused when given (see ``_key``), and so kept out of the help: the
    # option's own error would print the key argparse did not expect.
    parser.add_argument("--api-key", default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--allow-remote-without-key",
        action="store_true",
        help=f"bind beyond loopback without ${API_KEY_ENV} (anyone who reaches the port "
        "can read and change everything)",
    )
    parser.add_argument(
        "--traces-disabled",
        action="store_true",
        help="answer Prime Traces requests with 403 service_not_enabled",
    )
    parser.add_argument(
        "--train-teams",
        metavar="A,B",
        default=None,
        help="teams allowed to create external training runs (default: every team)",
    )
    parser.add_argument(
        "--retryable-rate",
        type=float,
        default=0.0,
        metavar="F",
        help="fraction of API requests refused with 429/503/502",
    )
    parser.add_argument(
        "--ambiguous-rate",
        type=float,
        default=0.0,
        metavar="F",
        help="fraction of API requests committed, then dropped before the answer",
    )
    parser.add_argument(
        "--bogus-rate",
        type=float,
        default=0.0,
        metavar="F",
        help="fraction of API requests answered 200 with an empty body, {}, an HTML page "
        "or JSON cut short (processed first or not, drawn evenly)",
    )
    parser.add_argument(
        "--max-body-bytes",
        type=int,
        default=0,
        metavar="N",
        help="answer 413 to API requests whose body is larger, as a proxy does (0: no limit)",
    )
    parser.add_argument(
        "--latency-ms", type=int, default=0, metavar="N", help="delay added to every API request"
    )
    parser.add_argument(
        "--fault-seed",
        type=int,
        default=0,
        metavar="N",
        help="seed of the fault RNG, so a run repeats",
    )
    parser.add_argument(
        "--fault-statuses",
        metavar="S,S",
        default="429,503,502",
        help="statuses of the retryable faults: 429 or 5xx, 500 included (default 429,503,502)",
    )
    parser.add_argument(
        "--fault-routes",
        metavar="P,P",
        default="",
        help="only requests whose path starts with one of these prefixes get faults "
        "(e.g. /api/v1/rft/metrics); default: every API route",
    )
    parser.add_argument(
        "--retry-after",
        type=float,
        default=0.1,
        metavar="S",
        help="Retry-After seconds on injected 429/503 (default 0.1)",
    )
    parser.add_argument(
        "--head-timeout",
        type=float,
        default=ConnectionLimits.head_timeout,
        metavar="S",
        help="seconds a connection has to send a request's whole head, from when it is "
        "accepted or answered: past it, closed (408 if part of one came) "
        f"(at least 1; default {ConnectionLimits.head_timeout:g})",
    )
    parser.add_argument(
        "--body-timeout",
        type=float,
        default=ConnectionLimits.body_timeout,
        metavar="S",
        help="longest silence, in seconds, while a request's body is read: past it, 408 "
        f"(at least 1; default {ConnectionLimits.body_timeout:g}); each such span of a "
        "body must also carry at least 1 KiB/s, and a client must take an answer waiting "
        "on it at that rate over each span: else closed",
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=ConnectionLimits.max_connections,
        metavar="N",
        help="connections open at once; past it, the one waiting longest for a request's "
        "head, or else the one sending a body or reading an answer slowest under 64 KiB/s, "
        "or else the new one, is answered 503 and closed "
        f"(default {ConnectionLimits.max_connections}; lowered, and said at start, where "
        "the limit on open files, ulimit -Hn, holds fewer)",
    )
    parser.add_argument(
        "--body-memory",
        type=int,
        default=ConnectionLimits.body_memory,
        metavar="MIB",
        help="MiB of unfinished request bodies (and answers waiting on their clients) held by "
        "all connections at once past which the one whose bytes pass it is answered 503 and "
        "closed (or, its answer under way, aborted) "
        f"(default {ConnectionLimits.body_memory})",
    )


def listening_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``(host, port)`` whose connections have Nagle off.

    ``proto=IPPROTO_TCP`` matters: asyncio turns Nagle's algorithm off only on
    sockets whose proto says TCP, and accepted sockets copy the listener's. With
    proto 0 every kept-alive response written in two parts waited ~40 ms for
    the client's delayed ACK. TCP_NODELAY on the listener is inherited as well.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def _ignore(signum: int, frame: FrameType | None) -> None:
    """Placeholder handler: uvicorn re-raises the stop signal after a graceful shutdown."""


def run_serve(args: argparse.Namespace) -> int:
    """Serve the local Prime platform (evaluations, environments hub, external
    training runs with their object store, and Prime Traces) on SQLite under
    --data, with optional fault injection, and its dashboard at /. Stops
    cleanly on SIGTERM or SIGINT; restarted on the same --data it serves
    everything it had stored. With --runs-dir DIR, serves only the dashboard,
    read from the run journals under DIR (never written to). With a key in
    $PRIMERUNS_LOCAL_API_KEY, every route asks for it ('Authorization: Bearer
    KEY'), the dashboard by a login link printed at start."""
    if args.api_key is not None:
        print(
            f"primeruns serve: refusing a key on the command line (every user of this "
            f"machine sees it in ps): set ${API_KEY_ENV} instead",
            file=sys.stderr,
        )
        return 2
    key = os.environ.get(API_KEY_ENV) or None
    if key is not None and not _key_usable(key):
        return 2
    if not _bind_allowed(args.host, key, args.allow_remote_without_key):
        return 2
    try:
        limits = ConnectionLimits(
            args.head_timeout, args.body_timeout, args.max_connections, args.body_memory
        )
        # The soft limit on descriptors raised for the cap, or the cap lowered.
        limits, lowered = descriptors.fit(limits)
    except ValueError as exc:
        print(f"primeruns serve: {exc}", file=sys.stderr)
        return 2
    notes = [] if lowered is None else [lowered]
    if args.runs_dir is not None:
        from .dashboard import offline_app

        if not Path(args.runs_dir).is_dir():
            print(f"primeruns serve: no directory {args.runs_dir} (--runs-dir)", file=sys.stderr)
            return 2
        app = offline_app(Path(args.runs_dir))
        return _serve(app, args.host, args.port, key, limits, notes=notes)
    data = Path(args.data) if args.data is not None else Path(DEFAULT_DATA)
    platform_app = _platform_app(args, data, key)
    if platform_app is None:
        return 2
    where = f"primeruns serve: storing what it is sent in {data.absolute()}"
    if args.data is None:
        where += " (the default; --data DIR stores it elsewhere)"
    return _serve(platform_app, args.host, args.port, key, limits, notes=[where, *notes])


def _key_usable(key: str) -> bool:
    """Whether clients can send ``key``; if not, says why (not the key) on stderr.

    Refused at start rather than served: a key no client can send locks
    everyone out, and every 401 would look like a wrong key.
    """
    from .guard import key_refusal

    refusal = key_refusal(key, API_KEY_ENV)
    if refusal is not None:
        print(f"primeruns serve: {refusal}", file=sys.stderr)
    return refusal is None


def _bind_allowed(host: str, key: str | None, waived: bool) -> bool:
    """Whether to bind ``host``: beyond loopback, only with a key or the explicit waiver.

    Without a key anyone who reaches the port reads every run and injects faults;
    on a shared login node that is every other user.
    """
    from .guard import is_loopback

    if is_loopback(host) or key is not None:
        return True
    if waived:
        print(
            f"primeruns serve: warning: listening on {host} without a key: anyone who "
            "reaches this port can read and change everything",
            file=sys.stderr,
        )
        return True
    print(
        f"primeruns serve: refusing to listen on {host} (beyond this machine) without a key: "
        f"set ${API_KEY_ENV}, or pass --allow-remote-without-key",
        file=sys.stderr,
    )
    return False


def _platform_app(args: argparse.Namespace, data: Path, key: str | None) -> Starlette | None:
    """The platform's app for these arguments, or None (said on stderr) if they are wrong."""
    from ..journal.trust import UntrustedPathError
    from .app import build_app
    from .faults import FaultSettings
    from .settings import ServerSettings

    teams = None
    if args.train_teams is not None:
        teams = frozenset(t.strip() for t in args.train_teams.split(",") if t.strip())
    settings = ServerSettings(
        data_dir=data,
        api_key=key,
        traces_disabled=args.traces_disabled,
        train_teams=teams,
        retry_after=args.retry_after,
    )
    try:
        try:
            statuses = tuple(int(x) for x in args.fault_statuses.split(",") if x.strip())
        except ValueError:
            raise ValueError("--fault-statuses must be comma-separated statuses") from None
        faults = FaultSettings(
            retryable_rate=args.retryable_rate,
            ambiguous_rate=args.ambiguous_rate,
            bogus_rate=args.bogus_rate,
            max_body_bytes=args.max_body_bytes,
            latency_ms=args.latency_ms,
            seed=args.fault_seed,
            retry_after=args.retry_after,
            statuses=statuses,
            routes=tuple(r.strip() for r in args.fault_routes.split(",") if r.strip()),
        )
        return build_app(settings, faults)
    except (ValueError, UntrustedPathError) as exc:  # a data folder another user could write
        print(f"primeruns serve: {exc}", file=sys.stderr)
        return None


#: A request's line and headers, together, past which h11 refuses them (400):
#: a browser on 127.0.0.1 sends every cookie any local server set for that
#: host, past uvicorn's 16 KiB default; the SDK's heads are under 1 KiB.
HEAD_LIMIT = 64 * 1024


def _serve(
    app: Starlette,
    host: str,
    port: int,
    key: str | None,
    limits: ConnectionLimits,
    notes: Sequence[str] = (),
) -> int:
    """Run ``app`` under uvicorn on ``host:port`` until SIGTERM/SIGINT, behind
    the guard, each connection held to ``limits``; ``notes`` are said after
    the listening line (which stays first: parents read the port from it)."""
    import asyncio

    import uvicorn

    from .bare_answers import ServeH11Protocol
    from .guard import Guard, GuardSettings, allowed_hosts, is_wildcard

    guard = Guard(app, GuardSettings(api_key=key, hosts=allowed_hosts(host)))
    ctx = getattr(app.state, "ctx", None)  # the platform's; the offline dashboard has none
    faults = None if ctx is None else ctx.faults

    try:
        sock = listening_socket(host, port)
    except OSError as exc:
        print(f"primeruns serve: cannot bind {host}:{port}: {exc}", file=sys.stderr)
        return 1
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host

    class _Server(uvicorn.Server):
        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            asyncio.get_running_loop().set_exception_handler(descriptors.AcceptErrors())
            await super().startup(sockets)
            print(f"primeruns serve: listening on http://{shown}:{port}", flush=True)
            for note in notes:
                print(note, flush=True)
            if key is not None:
                # Loopback in the link even when bound wider: it is for this machine's browser.
                guard.origin = f"http://{'127.0.0.1' if is_wildcard(host) else shown}:{port}"
                print(f"primeruns serve: dashboard login (once): {guard.login_url()}", flush=True)

        async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
            if faults is not None:
                faults.stopping.set()  # injected sleeps end now, not in an hour
            await super().shutdown(sockets)

    # Graceful shutdown waits for requests in flight, and an injected latency or
    # a slow-loris answer may be an hour long: past this, they are cancelled.
    config = uvicorn.Config(
        guard,
        # h11, even where httptools is installed (uvicorn[standard]), which
        # uvicorn would otherwise pick: its httptools protocol holds a head
        # however long it grows (a 16 MiB header line, a chunked body's
        # trailers) and parses and queues every request a client pipelines
        # before any is answered (+650 MB in 5 s from one connection, before
        # any key is checked); h11 bounds both. Measured: the platform on
        # httptools answers a metrics row in 0.45 of the instructions
        # (tools/bench/server_instructions.py); not worth those holes.
        # uvicorn's h11 protocol, each answer written once (``one_write``),
        # its own 400s with the guard's headers (``bare_answers``), deadlines
        # for a client slow to send its head or body and a bound on
        # connections (``slow_clients``; uvicorn's ``limit_concurrency``
        # answers a bare 503 and bounds no slow client).
        http=ServeH11Protocol.with_limits(limits),
        h11_max_incomplete_event_size=HEAD_LIMIT,
        backlog=descriptors.BACKLOG,  # (what is accepted at once: counted in its descriptors)
        ws="none",  # no route is a websocket: an upgrade is an ordinary request
        log_level="warning",
        access_log=False,
        # Nothing here is behind a proxy whose X-Forwarded-* headers it should
        # believe, and nobody needs to be told it is uvicorn: a layer and a
        # header fewer on every request and answer.
        proxy_headers=False,
        server_header=False,
        lifespan="on",
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
    )
    # uvicorn restores the previous handlers and re-raises the signal after its
    # graceful shutdown; with these in place that re-raise is a no-op and the
    # process exits 0.
    signal.signal(signal.SIGTERM, _ignore)
    signal.signal(signal.SIGINT, _ignore)
    _Server(config).run(sockets=[sock])
    return 0
