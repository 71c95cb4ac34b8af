"""Old journals stay readable: the checked-in sample (written by
tools/make_sample_journal.py) of every released format keeps reading.

A run killed before it shipped leaves its journal on the user's disk, and a
later prime-runs must ship it: ``ls`` and ``show`` read it as it was left,
``sync`` opens it as its owner and moves what is spooled into LMDB. Formats
1-3 were development formats, never released: they are refused, by name.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from primeruns.exceptions import JournalError
from primeruns.journal import Journal
from primeruns.journal.meta import K_FORMAT
from primeruns.journal.spool import list_segments

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data"


def _records() -> list[tuple[int, bytes]]:
    """What the sample holds. A format that changes what the tool writes must
    keep the older samples' records here too."""
    spec = importlib.util.spec_from_file_location("mk", ROOT / "tools" / "make_sample_journal.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [(int(k), p) for k, p in module.records()]


@pytest.mark.parametrize("owner", [False, True], ids=["reader", "owner"])
@pytest.mark.parametrize("version", [4])
def test_sample_reads(version: int, owner: bool, tmp_path: Path) -> None:
    name = f"sample-v{version}"
    copy = tmp_path / name  # never touch the checked-in files
    shutil.copytree(DATA / name, copy)
    assert list_segments(copy)  # its newest entries are spooled, as a killed run leaves them
    expected = _records()
    with Journal.open(copy, owner=owner) as j:
        assert j.local_id == name and j.get_meta("spec") == {"kind": "eval"}
        assert j.get_meta(K_FORMAT) == version
        got = j.read(0, max_entries=1000)
        assert [(int(e.kind), e.payload) for e in got.entries] == expected
        assert [e.seq for e in got.entries] == list(range(1, len(expected) + 1))
        assert j.last_seq() == len(expected)
        assert j.damage() == []
        cur = j.cursor("traces")
        assert cur.inflight is not None and cur.inflight.body == b"exact body"
        assert cur.inflight.state == {"idempotency_key": "k"}
        assert j.cursor("eval_samples").acked == 10
        assert j.losses()["eval_samples"] == {"count": 1, "reasons": ["422 sample rejected"]}
    if owner:
        assert list_segments(copy) == []  # moved into LMDB, and read from there
        with Journal.open(copy, owner=False) as j:
            assert [e.payload for e in j.read(0, max_entries=1000).entries] == [
                p for _, p in expected
            ]


def test_a_development_format_is_refused_by_name(tmp_path: Path) -> None:
    Journal.create(tmp_path, local_id="run").close()
    with Journal.open(tmp_path / "run") as j:
        j.set_meta(K_FORMAT, 3)
    # Twice as owner: the second refusal (not JournalLockedError) shows the
    # first let go of the lock.
    for owner in (True, True, False):
        with pytest.raises(JournalError, match="has format 3, a development format"):
            Journal.open(tmp_path / "run", owner=owner)
