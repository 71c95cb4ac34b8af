"""Fuzz the spool: any bytes as a spool segment must read, or be reported as damage.

Run (from the repository root, after ``pip install atheris``)::

    python fuzz/fuzz_spool.py fuzz/corpus/fuzz_spool -max_total_time=120 -rss_limit_mb=4096

Each input is written as the one spool segment of a fresh, empty journal,
which is then opened read-only (read, counted, scanned for damage) and as its
owner (the mover absorbs what it can into LMDB, the journal closes). Any
exception but JournalError, or an entry read back that is not a valid frame's
payload under its seq, is a bug. The seed corpus holds real segments (see
``make_corpus``) so that mutations start from valid appends.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import atheris

with atheris.instrument_imports():
    from primeruns.exceptions import JournalError
    from primeruns.journal import EntryKind, Journal
    from primeruns.journal.spool import list_segments, segment_name

_EMPTY: Path | None = None


def _empty_journal() -> Path:
    """A journal with nothing in it, made once and copied for each input."""
    global _EMPTY
    if _EMPTY is None:
        _EMPTY = Path(tempfile.mkdtemp(prefix="fuzz-spool-base-"))
        Journal.create(_EMPTY, local_id="r").close()
    return _EMPTY / "r"


def test_one_input(data: bytes) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="fuzz-spool-"))
    try:
        path = tmp / "r"
        shutil.copytree(_empty_journal(), path)
        (path / segment_name(1)).write_bytes(data)
        for owner in (False, True):
            try:
                journal = Journal.open(path, owner=owner)
            except JournalError:
                continue
            try:
                journal.damage()
                journal.tally()
                got = journal.read(0, max_entries=10_000)
                for entry in got.entries:
                    assert entry.seq >= 1 and isinstance(entry.payload, bytes)
            finally:
                journal.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def make_corpus(out: Path) -> None:
    """Write real spool segments as seeds (``python fuzz/fuzz_spool.py --make-corpus DIR``)."""
    out.mkdir(parents=True, exist_ok=True)
    for n in (1, 3, 12):
        with tempfile.TemporaryDirectory() as tmp:
            journal = Journal.create(Path(tmp), local_id="r")
            journal._mover.stop()  # keep them spooled
            for i in range(n):
                journal.append(EntryKind(1 + i % 6), [b'{"i":%d,"pad":"%s"}' % (i, b"z" * i * 37)])
            (_, name), *_ = list_segments(journal.path)
            shutil.copyfile(journal.path / name, out / f"segment-{n}")
            journal.close()


def main() -> None:
    if sys.argv[1:2] == ["--make-corpus"]:
        make_corpus(Path(sys.argv[2]))
        return
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
