"""The checked-in sample journal (written by tools/make_sample_journal.py) stays readable."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

from primeruns.journal import Journal

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).resolve().parent / "data"


def _records(version: int) -> list[tuple[int, bytes]]:
    spec = importlib.util.spec_from_file_location("mk", ROOT / "tools" / "make_sample_journal.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [(int(k), p) for k, p in module.records(version)]


@pytest.mark.parametrize("version", [1, 2, 3])
def test_sample_reads(version: int, tmp_path: Path) -> None:
    name = f"sample-v{version}"
    copy = tmp_path / name  # never touch the checked-in files
    shutil.copytree(DATA / name, copy)
    expected = _records(version)
    with Journal.open(copy) as j:
        assert j.local_id == name and j.get_meta("spec") == {"kind": "eval"}
        got = j.read(0, max_entries=1000)
        assert [(int(e.kind), e.payload) for e in got.entries] == expected
        assert [e.seq for e in got.entries] == list(range(1, len(expected) + 1))
        assert j.damage() == []
        cur = j.cursor("traces")
        assert cur.inflight is not None and cur.inflight.body == b"exact body"
        assert cur.inflight.state == {"idempotency_key": "k"}
        assert j.cursor("eval_samples").acked == 10
        assert j.losses()["eval_samples"] == {"count": 1, "reasons": ["422 sample rejected"]}
