"""A copy's local id (its journal's meta) names its sync journal under the
sync root: a copy is untrusted input, and an id that is a path (``../x``,
``./name``, ``a/b``) names another folder, here a sync journal that shipped
and closed its run. ``sync --all`` took the copy for that run's and passed
over it in silence, and ``ls`` described it as that run; now such a copy is
refused by name, as ``sync`` of it is, and is listed as a copy of its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_helpers import cli, offline_copy

from primeruns.journal import Journal
from primeruns.journal.meta import K_LOCAL_ID
from primeruns.ship.copies import K_SOURCE_PATH, make_sync_root, sync_root


def _copy_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, local_id: str) -> Path:
    """An offline run's journal copied to a login folder, its local id made
    ``local_id``; where that id leads from the sync root, a journal as a
    sync journal that shipped and closed its run leaves it."""
    copy = offline_copy(tmp_path, monkeypatch)
    with Journal.open(copy, owner=True) as journal:
        journal.set_meta(K_LOCAL_ID, local_id)
    root = make_sync_root(sync_root())
    there = root / local_id
    there.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with Journal.create(there.parent, local_id=there.name) as other:
        assert other.path == there
        other.update_meta(
            {
                "state": "shipped",
                "finalized": True,
                K_SOURCE_PATH: {"path": "elsewhere", "imported_upto": 1 << 40},
            }
        )
    return copy


@pytest.mark.parametrize("local_id", ["../x", "./name", "a/b"])
def test_a_copy_whose_local_id_is_a_path_is_refused_by_sync_all_naming_it(
    local_id: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    copy = _copy_named(tmp_path, monkeypatch, local_id)
    code, out, err = cli(capsys, "sync", "--all", "--runs-dir", str(copy.parent))
    refused = f"{copy}: the copy names an invalid local run id {local_id!r}; not syncing it"
    assert code != 0 and refused in err, (code, out, err)
    code, out, err = cli(capsys, "sync", str(copy))
    assert code != 0 and refused in err, (code, out, err)
    code, out, err = cli(capsys, "ls", "--json", "--runs-dir", str(copy.parent))
    [listed] = json.loads(out)
    assert code == 0 and listed["synced_through"] is None, listed  # not the other run's
