"""Readers that show records bound what one entry or meta value may cost them.

An entry declaring 100 MiB (a zstd bomb a few KB on disk) is neither copied
nor decompressed by a read with ``max_entry_bytes``: it is listed with its
declared size, so a page says what it left out. Meta values over a size are
left out of a bounded listing, named. A meta value or cursor is read at most
``txn.MAX_VALUE_BYTES`` and ``MAX_VALUES`` values, the whole meta as much:
a journal is untrusted, and the CLI read a 128 MiB zstd bomb whole.
"""

from __future__ import annotations

from pathlib import Path

import lmdb
import zstandard

from primeruns.journal import EntryKind, Journal
from primeruns.journal.frames import FLAG_ZSTD, _assemble
from primeruns.journal.layout import META_KIND
from primeruns.journal.meta import K_LOCAL_ID, K_OVERSIZED, MAX_META_BYTES
from primeruns.journal.txn import MAX_VALUE_BYTES, MAX_VALUES

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


def _inflating_frame(size: int) -> bytes:
    """A valid meta frame of a JSON string of ``size`` bytes, packed by zstd
    into a few KB: what a journal copied from elsewhere may hold."""
    payload = b'"' + b"x" * (size - 2) + b'"'
    packed = zstandard.ZstdCompressor(level=3, write_content_size=True).compress(payload)
    return _assemble(META_KIND, FLAG_ZSTD, 0, size, packed, None)


def test_a_meta_value_or_cursor_past_the_bound_is_named_never_decoded(tmp_path: Path) -> None:
    """A listing's read of the meta (``all_meta`` with a bound), the cursors'
    offsets and the full scan refuse a value declaring more than
    ``MAX_VALUE_BYTES`` before decompressing it, and name it; the journal's
    other values are read as before."""
    size = MAX_VALUE_BYTES + 2
    bomb = _inflating_frame(size)
    with Journal.create(tmp_path / "runs", local_id="run", meta={"small": 1}) as journal:
        tx = journal._tx

        def put(txn: lmdb.Transaction) -> None:
            txn.put(K_LOCAL_ID.encode(), bomb, db=tx.dbs["meta"])
            txn.put(b"traces", bomb, db=tx.dbs["cursors"])

        tx.write(put)
        path = journal.path
    with Journal.open(path, owner=False) as journal:
        meta = journal.all_meta(MAX_META_BYTES)
        assert meta["small"] == 1 and meta[K_OVERSIZED] == {K_LOCAL_ID: size}
        assert journal.cursors() == {}
        scanned = [d.what for d in journal.damage()]
    assert any("cursors key 'traces'" in d and "limit" in d for d in scanned), scanned
    assert any(f"meta key {K_LOCAL_ID!r}" in d and "limit" in d for d in scanned), scanned


def test_the_whole_meta_is_bounded_in_values_not_only_each_value(tmp_path: Path) -> None:
    """Values of tiny containers, each under the byte bound, are read while
    the whole meta stays within ``MAX_VALUES`` values; the rest are named."""
    many = [[] for _ in range(MAX_VALUES // 3)]  # each value under the bound alone
    values = {f"many.{i}": many for i in range(4)}
    with Journal.create(tmp_path / "runs", meta={**values, "small": 1}) as journal:
        meta = journal.all_meta(MAX_META_BYTES)
        whole = journal.all_meta()  # the SDK's own read: what it wrote, whole
    assert all(whole[key] == many for key in values)
    left_out = meta[K_OVERSIZED]
    assert meta["small"] == 1 and meta["many.0"] == many and "many.3" in left_out
    for key in values:  # each read whole or named, never half
        assert (key in left_out) != (meta.get(key) == many), key


def test_a_meta_value_past_a_listings_bound_is_read_whole_by_the_sdk(tmp_path: Path) -> None:
    """A spec whose config is larger than a listing reads is the user's own:
    the SDK's reads (a re-homed journal, a copy's meta, the spec at sync) get
    it whole; only a listing leaves it out, named."""
    config = {"table": "x" * (MAX_VALUE_BYTES + 1024)}
    with Journal.create(tmp_path / "runs", meta={"spec": {"config": config}}) as journal:
        path = journal.path
    with Journal.open(path, owner=False) as journal:
        assert journal.all_meta()["spec"]["config"] == config
        assert journal.get_meta("spec")["config"] == config
        assert "spec" in journal.all_meta(MAX_META_BYTES)[K_OVERSIZED]


def test_a_listing_passes_over_what_the_sinks_carry(tmp_path: Path) -> None:
    """An evaluation of 200,000 examples carries its rollout numbering in
    parts (``[example, count]`` pairs, three values each): more than a
    listing's bound on the whole meta. A listing never shows it, so it is
    not read: the run's spec is listed, not named oversized (its journal
    listed as damaged). The SDK's own read gets the parts whole."""
    parts = {
        f"carry.eval_samples.rollouts.{i}": [[i * 16 + k, 4] for k in range(16)]
        for i in range(200_000 // 16)
    }
    with Journal.create(tmp_path / "runs", meta={**parts, "spec": {"name": "eval"}}) as journal:
        listed = journal.all_meta(MAX_META_BYTES)
        whole = journal.all_meta()
    assert listed["spec"] == {"name": "eval"} and K_OVERSIZED not in listed
    assert not any(key.startswith("carry.") for key in listed)
    assert whole["carry.eval_samples.rollouts.7"] == parts["carry.eval_samples.rollouts.7"]
