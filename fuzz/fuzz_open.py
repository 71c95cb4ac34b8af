"""Fuzz journal opening: any bytes as ``data.mdb`` must open, or be refused with JournalError.

Run (from the repository root, after ``pip install atheris``)::

    python fuzz/fuzz_open.py fuzz/corpus/fuzz_open -max_total_time=120 -rss_limit_mb=4096

Each input is written as the ``data.mdb`` of a fresh journal directory, opened
read-only, fully verified (``damage()``) and read. A crash, an abort inside
LMDB, an exception from ``damage()``/``read()`` or any exception other than
JournalError elsewhere is a bug. The seed corpus holds
small real journals (see ``make_corpus`` below) so mutations start from valid
LMDB structure.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
import tempfile
from pathlib import Path

import atheris

with atheris.instrument_imports():
    from primeruns.exceptions import JournalError
    from primeruns.journal import EntryKind, Journal


def test_one_input(data: bytes) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="fuzz-open-"))
    try:
        (tmp / "data.mdb").write_bytes(data)
        try:
            journal = Journal.open(tmp, owner=False)
        except JournalError:
            return
        try:
            # These two report damage and never raise for it.
            journal.damage()
            journal.read(0, max_entries=10_000)
            # These may refuse a damaged table, but only with JournalError.
            for call in (journal.losses, journal.cursors, journal.all_meta, journal.last_seq):
                with contextlib.suppress(JournalError):
                    call()
        finally:
            journal.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def make_corpus(out: Path) -> None:
    """Write small valid journals as seeds (``python fuzz/fuzz_open.py --make-corpus DIR``)."""
    out.mkdir(parents=True, exist_ok=True)
    for n in (1, 8, 40):
        with tempfile.TemporaryDirectory() as tmp:
            with Journal.create(Path(tmp), local_id="r") as j:
                for i in range(n):
                    j.append(EntryKind(1 + i % 6), [b'{"i":%d,"pad":"%s"}' % (i, b"z" * (i * 97))])
                j.ack("traces", n // 2)
            shutil.copyfile(Path(tmp) / "r" / "data.mdb", out / f"journal-{n}.mdb")


def main() -> None:
    if sys.argv[1:2] == ["--make-corpus"]:
        make_corpus(Path(sys.argv[2]))
        return
    atheris.Setup(sys.argv, test_one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
