"""Readers that show records bound what one entry or meta value may cost them.

An entry declaring 100 MiB (a zstd bomb a few KB on disk) is neither copied
nor decompressed by a read with ``max_entry_bytes``: it is listed with its
declared size, so a page says what it left out. Meta values over a size are
left out of a bounded listing, named.
"""

from __future__ import annotations

from pathlib import Path

from primeruns.journal import EntryKind, Journal
from primeruns.journal.meta import K_OVERSIZED

BIG = 100 << 20


def test_an_entry_over_max_entry_bytes_is_listed_not_decoded(tmp_path: Path) -> None:
    with Journal.create(tmp_path / "runs") as journal:
        journal.append(EntryKind.EPISODE, [b'{"id": "small"}'])
        journal.append(EntryKind.EPISODE, [b'"' + b"x" * BIG + b'"'])
        journal.append(EntryKind.EPISODE, [b'{"id": "after"}'])
        path = journal.path
    with Journal.open(path, owner=False) as journal:
        bounded = journal.read(0, kinds={EntryKind.EPISODE}, max_entry_bytes=1 << 20)
        headers = journal.read(0, kinds={EntryKind.EPISODE}, max_entry_bytes=0)
    assert [e.payload for e in bounded.entries] == [b'{"id": "small"}', b'{"id": "after"}']
    assert [(seq, size) for seq, _, size in bounded.oversized] == [(2, BIG + 2)]
    assert headers.entries == [] and [seq for seq, _, _ in headers.oversized] == [1, 2, 3]


def test_meta_values_over_the_bound_are_left_out_and_named(tmp_path: Path) -> None:
    with Journal.create(tmp_path / "runs", meta={"big": "x" * (2 << 20), "small": 1}) as journal:
        bounded = journal.all_meta(1 << 20, lambda v: ("shaped", v))
        whole = journal.all_meta()
    assert bounded["small"] == ("shaped", 1) and "big" not in bounded
    assert set(bounded[K_OVERSIZED]) == {"big"} and len(whole["big"]) == 2 << 20


def test_a_meta_value_nested_too_deep_leaves_the_others_readable(tmp_path: Path) -> None:
    with Journal.create(tmp_path / "runs", meta={"small": 1}) as journal:
        tx = journal._tx
        tx.write(lambda txn: tx.put_meta_bytes(txn, "deep", b"[" * 100_000 + b"]" * 100_000))
        meta = journal.all_meta()
    assert meta["small"] == 1 and "deep" not in meta
