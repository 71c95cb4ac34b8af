"""The doorbell between a producer and its uplink: the producer rings for a
kind only while a shipper of that kind waits, and a ring wakes every waiter.

Both ends map one memfd, as the two processes do (the second mapping here
comes from a duplicate of the descriptor, as the uplink's comes from the one
it inherits).
"""

from __future__ import annotations

import os

import pytest

from primeruns.journal import EntryKind
from primeruns.ship.doorbell import Doorbell

pytestmark = pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="needs memfd")


def test_a_ring_only_for_a_kind_someone_waits_for_and_every_flag_lowered_by_it() -> None:
    producer = Doorbell.create()
    assert producer is not None
    uplink = Doorbell(os.dup(producer.fd))
    try:
        assert not producer.answer(EntryKind.EPISODE)  # nobody waits yet
        uplink.listening([EntryKind.METRICS])  # the metrics shipper waits
        uplink.listening([EntryKind.EPISODE, EntryKind.TRACE])  # so does the traces one
        assert not producer.answer(EntryKind.FINISH)
        assert producer.answer(EntryKind.METRICS)  # rings: the waiters all wake
        assert not producer.answer(EntryKind.EPISODE)  # lowered until they wait again
        uplink.listening(None)  # a waiter for any kind
        assert producer.answer(EntryKind.SUMMARY)
    finally:
        uplink.close()
        producer.close()
