"""Run a command as another, unprivileged user: the hostile-neighbour tests
(#27) plant files as one real uid and read them as another, not as root
pretending with ``chown``.

A process that changes its uid from root keeps no capability here
(``setpriv --inh-caps=-all --bounding-set=-all``): one that kept
``CAP_DAC_READ_SEARCH`` would read another user's private folder and hide
exactly the failures these tests look for.

The interpreter, its packages, this checkout or the test's folder may sit
below a folder the other user cannot enter (a pyenv under a 0700 home,
pytest's 0700 temporary root). The command then runs in a private mount
namespace where the folder in the way is covered by an empty, enterable one
through which exactly those paths are mounted again: the paths stay the same
(``sys.executable`` works for the command's own children too), and nothing
changes outside that namespace.

Needs root, ``setpriv``, ``unshare`` and ``mount``: :func:`require` skips a
test otherwise, and fails it under CI, where these tests must run.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ATTACKER = (65534, 65534)  # nobody:nogroup
VICTIM = (65533, 65533)  # an unprivileged uid with no name, no home, no group


def require() -> None:
    """Skip the calling test where no second uid can be had; fail it under CI."""
    missing = [tool for tool in ("setpriv", "unshare", "mount") if shutil.which(tool) is None]
    if os.geteuid() == 0 and not missing:
        return
    why = "needs root" if os.geteuid() != 0 else f"needs {', '.join(missing)}"
    message = f"a second uid {why}"
    if os.environ.get("CI"):
        pytest.fail(f"{message}: CI runs as root and must run this test")
    pytest.skip(message)


def env_of(home: Path, **extra: str) -> dict[str, str]:
    """The environment of a process run as another uid: this checkout on its
    path, ``home`` as HOME, nothing of ours (no PRIME_* setting), and ``extra``."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "PYTHONPATH": str(REPO),
        "PYTHONDONTWRITEBYTECODE": "1",
        **extra,
    }


def give(path: Path, owner: tuple[int, int], mode: int) -> Path:
    """Make ``path`` a folder of ``owner`` with ``mode`` (as root)."""
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, *owner)
    os.chmod(path, mode)
    return path


def run_as(
    owner: tuple[int, int],
    argv: list[str],
    *,
    reach: list[Path],
    env: dict[str, str],
    timeout: float = 180,
) -> subprocess.CompletedProcess[str]:
    """``argv`` as ``owner`` (uid, gid) with no supplementary group and no
    capability; every path in ``reach`` (and the interpreter, its packages
    and this checkout) can be entered on the way, as the module doc says."""
    needed = [*_interpreter_paths(), REPO, *reach]
    drop = [
        "setpriv",
        f"--reuid={owner[0]}",
        f"--regid={owner[1]}",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--",
        *argv,
    ]
    cmd = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--",
        sys.executable,
        __file__,
        os.pathsep.join(map(str, needed)),
        *drop,
    ]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def _interpreter_paths() -> list[Path]:
    paths = {Path(sys.base_prefix), Path(sys.prefix)}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        paths.add(Path(sysconfig.get_paths()[key]))
    return sorted(paths)


def _enterable_by_others(directory: Path) -> bool:
    return bool(os.stat(directory).st_mode & stat.S_IXOTH)


def _blocker(path: Path) -> Path | None:
    """The shallowest folder on the way to ``path`` that others cannot enter."""
    for ancestor in reversed(path.parents):
        if ancestor != Path("/") and not _enterable_by_others(ancestor):
            return ancestor
    return None


def _mount(*args: str) -> None:
    subprocess.run(["mount", *args], check=True)


def _open_the_way(needed: list[Path]) -> None:
    """In this (private) mount namespace: cover each folder in the way with
    an empty, enterable one and mount the needed paths back into it."""
    blocked = {p: b for p in needed if (b := _blocker(p)) is not None}
    if not blocked:
        return
    tops = {b for b in blocked.values() if not any(o in b.parents for o in blocked.values())}
    staged: list[tuple[Path, str]] = []
    for path in sorted(blocked):
        if any(path != other and other in path.parents for other in blocked):
            continue  # comes along inside a shallower needed path
        stage = tempfile.mkdtemp(prefix="second-uid-")
        _mount("--rbind", str(path), stage)
        staged.append((path, stage))
    for top in tops:
        _mount("-t", "tmpfs", "-o", "mode=0755", "tmpfs", str(top))
    os.umask(0o022)
    for path, stage in staged:
        path.mkdir(parents=True, exist_ok=True)
        _mount("--move", stage, str(path))
        os.rmdir(stage)


if __name__ == "__main__":  # run by run_as inside the new mount namespace, as root
    _open_the_way([Path(p) for p in sys.argv[1].split(os.pathsep)])
    os.execvp(sys.argv[2], sys.argv[2:])
