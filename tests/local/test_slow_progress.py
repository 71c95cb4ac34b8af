"""How the bound judges a connection's progress, on one protocol in process.

A moment a loopback test cannot pick: the server resumed reading a body it
held up, and the client's next bytes have not come in yet.
"""

from __future__ import annotations

from types import SimpleNamespace

import h11

from primeruns.local.slow_clients import FAIR_RATE, JUDGED_AFTER, BoundedH11Protocol


def test_a_body_whose_reading_just_resumed_is_not_judged_on_the_pause() -> None:
    """The server held a body up (its app had not taken 64 KiB of it) for
    longer than progress is judged after, then read on; until the client's
    next bytes came in, a new connection past the bound judged it on the
    pause (no bytes over seconds: rate 0) and evicted a client that was
    sending as fast as it was let."""
    protocol = BoundedH11Protocol.__new__(BoundedH11Protocol)
    protocol.transport = SimpleNamespace(is_closing=lambda: False, get_write_buffer_size=lambda: 0)
    protocol.flow = SimpleNamespace(write_paused=False, read_paused=False)  # (just resumed)
    protocol.conn = SimpleNamespace(their_state=h11.SEND_BODY)
    protocol.cycle = None
    protocol._sent_from = None
    protocol._received = 10 * 2**20
    # Where the last look, during the pause, left the body's clock.
    protocol._body_from = protocol._body_start = 100.0
    protocol._body_start_base = protocol._received
    protocol._held_up = True
    protocol._judged_time, protocol._judged_bytes = 0.0, 0
    assert protocol._progress(100.0 + 5 * JUDGED_AFTER) is None


def test_a_second_answer_on_a_kept_alive_connection_is_judged_from_its_own_start() -> None:
    """A client took a 1 MiB answer whose writes paused, then asked again
    (its next head) and the app worked 100 s on it; the second answer's
    writes paused and the client took 4 MiB of it in 2 s. Judged from the
    first answer's start, that was 5 MiB over 103 s, under FAIR_RATE, and a
    new connection past the bound aborted a client reading at 2 MiB/s."""
    clock = [100.0]
    state = {"written": 0, "buffered": 0}
    protocol = BoundedH11Protocol.__new__(BoundedH11Protocol)
    protocol.loop = SimpleNamespace(time=lambda: clock[0])
    protocol.transport = SimpleNamespace(
        is_closing=lambda: False,
        get_write_buffer_size=lambda: state["buffered"],
        get_extra_info=lambda name: None,
    )
    protocol.flow = SimpleNamespace(write_paused=True, read_paused=False)
    protocol.conn = SimpleNamespace(their_state=h11.DONE)
    protocol.cycle = None
    protocol._sent_from = None
    protocol._due = lambda: None  # type: ignore[method-assign]  # (no timer here)

    def written(total: int, buffered: int) -> None:
        state["written"], state["buffered"] = total, buffered
        protocol.transport.written = total  # type: ignore[attr-defined]

    written(2**20, 2**20)
    protocol._answer_waits()  # the first answer's writes paused at 100 s
    clock[0] = 101.0
    written(2**20, 0)
    protocol.flow.write_paused = False  # all of it taken
    protocol._watch()  # the client's next head
    clock[0] = 201.0  # the app's work on it
    written(2**20 + 8 * 2**20, 8 * 2**20)
    protocol.flow.write_paused = True
    protocol._answer_waits()  # the second answer's writes paused
    clock[0] = 203.0
    written(2**20 + 8 * 2**20, 4 * 2**20)  # 4 MiB of it taken since, at 2 MiB/s
    rate = protocol._progress(clock[0])
    assert rate is not None and rate > FAIR_RATE
