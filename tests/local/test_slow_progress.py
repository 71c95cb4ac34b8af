"""How the bound judges a connection's progress, on one protocol in process.

A moment a loopback test cannot pick: the server resumed reading a body it
held up, and the client's next bytes have not come in yet.
"""

from __future__ import annotations

from types import SimpleNamespace

import h11

from primeruns.local.slow_clients import JUDGED_AFTER, BoundedH11Protocol


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
