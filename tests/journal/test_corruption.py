"""Byte flips and truncations of data.mdb: precise reports, no crash, intact entries readable.

Each damaged copy is opened in a child process, so that a crash (which the
journal must never cause) fails the test instead of killing the test run.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from primeruns.journal import EntryKind, Journal

N = 200
_PROBE = """
import json, sys
from pathlib import Path
from primeruns.exceptions import JournalError
from primeruns.journal import Journal
try:
    j = Journal.open(Path(sys.argv[1]), owner=sys.argv[2] == "owner")
except JournalError as exc:
    print(json.dumps({"error": str(exc)})); sys.exit(0)
damage = [[d.seq, d.what] for d in j.damage()]
scan = j.checksums()
checked = {"damage": [[d.seq, d.what] for d in scan.damage],
           "seqs": sorted(s for seqs in scan.seqs.values() for s in seqs)}
got = j.read(0, max_entries=10**6, max_bytes=1 << 40)
print(json.dumps({"damage": damage, "entries": {e.seq: e.payload.decode() for e in got.entries},
                  "checked": checked}))
j.close()
"""


def _payload(i: int) -> bytes:
    return json.dumps({"i": i, "pad": "y" * (i * 53 % 6000)}).encode()


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("pristine")
    with Journal.create(base, local_id="run") as j:
        for i in range(1, N + 1):
            j.append(EntryKind.METRICS if i % 2 else EntryKind.EPISODE, [_payload(i)])
    return base / "run"


def _probe(path: Path, mode: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, str(path), mode], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, f"journal code crashed: {out.returncode} {out.stderr[-500:]}"
    result: dict[str, object] = json.loads(out.stdout)
    return result


@pytest.mark.parametrize("trial", range(12))
def test_flips_and_truncations(pristine: Path, tmp_path: Path, trial: int) -> None:
    rng = random.Random(trial)
    path = tmp_path / "run"
    shutil.copytree(pristine, path)
    data = path / "data.mdb"
    raw = bytearray(data.read_bytes())
    if trial % 2:
        del raw[rng.randrange(8192, len(raw)) :]
    else:
        for _ in range(rng.randint(1, 8)):
            raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
    data.write_bytes(bytes(raw))
    result = _probe(path, "owner" if trial % 4 < 2 else "reader")
    if "error" in result:
        # Only a file with no recognisable structure at all may be refused, clearly.
        assert "journal" in str(result["error"])
        return
    entries = result["entries"]
    assert isinstance(entries, dict)
    for seq, text in entries.items():  # whatever is returned is exactly what was written
        assert text.encode() == _payload(int(seq))
    damage = result["damage"]
    assert isinstance(damage, list)
    if len(entries) < N:
        assert damage, "lost entries must be reported"
    for seq, what in damage:
        assert what and (seq is None or f"{seq}" in what)
    # Checksums alone (what ``show`` checks with) find the same damage, and
    # pass exactly the entries that decode.
    checked = result["checked"]
    assert isinstance(checked, dict)
    assert sorted(map(tuple, checked["damage"]), key=str) == sorted(map(tuple, damage), key=str)
    assert checked["seqs"] == sorted(int(seq) for seq in entries)


def test_flipped_entry_is_reported_precisely(tmp_path: Path) -> None:
    with Journal.create(tmp_path, local_id="run") as j:
        j.append(EntryKind.METRICS, [b'{"a":"' + b"q" * 40 + b'"}', b'{"b":"target-value"}', b"{}"])
    data = tmp_path / "run" / "data.mdb"
    raw = bytearray(data.read_bytes())
    at = raw.find(b"target-value")
    assert at > 0
    raw[at] ^= 0x01
    data.write_bytes(bytes(raw))
    with Journal.open(tmp_path / "run", owner=False) as j:
        got = j.read(0)
        assert [e.seq for e in got.entries] == [1, 3]
        (d,) = got.damaged
        assert d.seq == 2 and d.what.startswith("entry 2: checksum mismatch (stored ")
        assert got.next_after == 3
        assert [x.seq for x in j.damage()] == [2]


@pytest.mark.parametrize("owner", [True, False])
def test_a_table_name_lost_to_a_flip_is_damage_not_an_empty_table(
    tmp_path: Path, owner: bool
) -> None:
    """A flip in the main tree's key "entries" hides the table: opening for
    writing must not create it anew and empty, reading 0 entries and no damage."""
    payloads = [_payload(i) for i in range(1, 41)]
    with Journal.create(tmp_path, local_id="run") as j:
        j.append(EntryKind.METRICS, payloads)
    data = tmp_path / "run" / "data.mdb"
    raw = data.read_bytes()
    assert raw.count(b"entries") >= 1  # the main tree's key (its current and older page)
    data.write_bytes(raw.replace(b"entries", b"entriez"))
    result = _probe(tmp_path / "run", "owner" if owner else "reader")
    if "error" in result:
        assert "journal" in str(result["error"])
        return
    entries = result["entries"]
    assert isinstance(entries, dict) and result["damage"], "the loss must be reported"
    assert {int(seq): text.encode() for seq, text in entries.items()} == dict(
        enumerate(payloads, 1)
    )
