"""Exactly once while ``primeruns serve``'s bound lets the SDK's connections go.

Past ``--max-connections`` a new connection takes the place of one waiting
on a head (the SDK's pool keeps connections alive between requests) or of
the one sending a body under ``FAIR_RATE`` (answered 503, ``Retry-After``).
Here the SDK reaches the platform through a link that carries its requests
at 48 KiB/s (a proxy), and a neighbour opens connections of its own to the
platform until two of the SDK's were let go with a request part sent (its
pushes of 15 episodes' samples and traces take seconds at that pace; with
two places the SDK's own connections also take each other's): a training
run's metrics rows and an evaluation's samples still land every one once,
in order, and nothing is counted lost.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import rel_torture as rt
import workloads
from sdk_helpers import platform_metric_steps

import primeruns as pr
from primeruns.local import LocalPlatform
from primeruns.local.slow_clients import BUSY_BODY

WAIT_S = 30.0
#: The link's pace toward the platform: a piece every 20 ms (48 KiB/s, under
#: the bound's FAIR_RATE of 64 KiB/s).
PIECE, EVERY_S = 1024, 0.02


class _Requests:
    """Where a connection's requests stand, from the bytes sent of them."""

    def __init__(self) -> None:
        self.head = b""
        self.body_left = 0

    def sent(self, data: bytes) -> None:
        while data:
            if self.body_left:
                taken = min(self.body_left, len(data))
                self.body_left -= taken
                data = data[taken:]
                continue
            self.head += data
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            for line in self.head[:end].lower().split(b"\r\n"):
                if line.startswith(b"content-length:"):
                    self.body_left = int(line.split(b":")[1])
            data, self.head = self.head[end + 4 :], b""

    def under_way(self) -> bool:
        """Whether a request is part sent."""
        return bool(self.head or self.body_left)


class SlowLink:
    """A proxy to ``port``: requests go at the link's pace, answers at once.
    Counts the SDK's connections the platform let go (answered the bound's
    503, or reset), and of them those let go with a request part sent."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.let_go = self.cut = 0
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._closed.set()
        self._listener.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.port), timeout=WAIT_S)
            requests = _Requests()
            threading.Thread(target=self._up, args=(client, server, requests), daemon=True).start()
            threading.Thread(
                target=self._down, args=(server, client, requests), daemon=True
            ).start()

    def _up(self, client: socket.socket, server: socket.socket, requests: _Requests) -> None:
        try:
            while data := client.recv(PIECE):
                server.sendall(data)
                requests.sent(data)
                self._closed.wait(EVERY_S)  # (the link's pace)
        except OSError:
            pass
        _shut(client, server)

    def _down(self, server: socket.socket, client: socket.socket, requests: _Requests) -> None:
        try:
            while data := server.recv(65536):
                if BUSY_BODY in data:
                    self._count(requests)
                client.sendall(data)
        except ConnectionResetError:
            self._count(requests)
        except OSError:
            pass
        _shut(client, server)

    def _count(self, requests: _Requests) -> None:
        with self._lock:
            self.let_go += 1
            self.cut += requests.under_way()


def _shut(*socks: socket.socket) -> None:
    for sock in socks:
        with suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()


@contextmanager
def _neighbour(platform: LocalPlatform, until: Callable[[], bool]) -> Iterator[None]:
    """Connections of another client to the platform, one every 50 ms, each
    asking for ``/healthz``, until ``until()`` (or the block ends)."""
    port = int(platform.url.rsplit(":", 1)[1])
    done = threading.Event()

    def open_them() -> None:
        while not done.is_set() and not until():
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=WAIT_S) as sock:
                    sock.sendall(
                        b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
                    )
                    while sock.recv(65536):
                        pass
            except OSError:
                pass
            done.wait(0.05)  # (the neighbour's pace)

    thread = threading.Thread(target=open_them, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(WAIT_S)


def _sample_ids(platform: LocalPlatform, eval_id: str) -> list[str]:
    """The evaluation's sample ids as the platform holds them, in its order."""
    import sqlite3

    conn = sqlite3.connect(f"file:{platform.data_dir / 'platform.sqlite3'}?mode=ro", uri=True)
    try:
        query = "SELECT sample_id FROM eval_samples WHERE eval_id = ? ORDER BY row"
        return [str(r[0]) for r in conn.execute(query, (eval_id,))]
    finally:
        conn.close()


def test_rows_and_samples_land_once_while_the_bound_lets_the_sdks_connections_go(
    make_local_platform: Callable[..., LocalPlatform], tmp_path: Path
) -> None:
    platform = make_local_platform(max_connections=2, head_timeout=60, body_timeout=60)
    link = SlowLink(int(platform.url.rsplit(":", 1)[1]))
    rows, episodes = 40, workloads.gsm8k(60)
    common = {"api_key": rt.KEY, "base_url": link.url, "runs_dir": tmp_path / "runs"}
    try:
        with rt.sdk_env(link.url, tmp_path / "home"):
            train = pr.init(kind="train", model="m", team_id="team-a", **common)
            evaluation = pr.init(environments=["gsm8k"], model="m", **common)
            with _neighbour(platform, lambda: link.cut >= 2):
                for at in range(0, len(episodes), 15):
                    evaluation.log_episodes(episodes[at : at + 15])
                    for step in range(
                        at * rows // len(episodes), (at + 15) * rows // len(episodes)
                    ):
                        train.log_metrics({"loss": 1.0 / (step + 1)}, step=step)
                while link.cut < 2 and not (
                    train.flush(timeout=0.5) and evaluation.flush(timeout=0.5)
                ):
                    pass
            train.finish(timeout=120)
            evaluation.finish(timeout=120)
    finally:
        link.close()
    assert link.cut > 0, "the bound never let one of the SDK's requests go part sent"
    for run in (train, evaluation):
        assert run.status is pr.RunStatus.COMPLETED, run.status
        assert not run.dropped_records and not any(run.failed_records.values())
    assert train.id is not None and evaluation.id is not None
    assert platform_metric_steps(platform.data_dir, train.id) == {s: 1 for s in range(rows)}
    assert _sample_ids(platform, evaluation.id) == [e["id"] for e in episodes]
    assert "Traceback" not in platform.log_path.read_text()
