"""Detect network filesystems under a journal, and warn once with the fix.

LMDB relies on a shared memory map and POSIX locks behaving like a local disk;
on NFS, Lustre, GPFS, CIFS/SMB, CephFS or FUSE they do not (stale pages, locks
that are advisory at best, corruption when two nodes open one run). Cluster
home directories are often such mounts, so the journal says so at open and
names the fix instead of failing later in a way nobody can explain.

Detection is ``statfs(2)``'s ``f_type`` on Linux, with ``/proc/self/mountinfo``
as the fallback. ``PRIME_RUNS_ALLOW_NETWORK_FS=1`` silences the warning.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import warnings
from pathlib import Path

from primeruns.libc import libc
from primeruns.settings import ALLOW_NETWORK_FS_ENV, allow_network_fs

__all__ = ["ALLOW_ENV", "NetworkFilesystemWarning", "network_fs_type", "warn_if_network_fs"]

ALLOW_ENV = ALLOW_NETWORK_FS_ENV  # read by primeruns.settings, strictly

# statfs f_type magic numbers (linux/magic.h and the filesystems' own headers).
_MAGIC = {
    0x6969: "nfs",
    0x517B: "smb",
    0xFF534D42: "cifs",
    0xFE534D42: "smb2",
    0x0BD00BD0: "lustre",
    0x47504653: "gpfs",
    0x00C36400: "ceph",
    0x65735546: "fuse",
    0x5346414F: "afs",
    0x01021997: "9p",
    0x013111A8: "ibrix",
    0x19830326: "fhgfs",  # BeeGFS
}
# Names as they appear in the mountinfo fstype column.
_NAMES = (
    "nfs",
    "nfs4",
    "cifs",
    "smb",
    "smb3",
    "smbfs",
    "lustre",
    "gpfs",
    "ceph",
    "fuse",
    "afs",
    "9p",
    "beegfs",
    "glusterfs",
)

_warned: set[str] = set()
_warned_lock = threading.Lock()


class NetworkFilesystemWarning(UserWarning):
    """The journal directory is on a network filesystem, where LMDB is unsafe."""


class _Statfs(ctypes.Structure):
    # Only f_type is read; the buffer is oversized so any libc layout fits.
    _fields_ = [("f_type", ctypes.c_long), ("_rest", ctypes.c_byte * 256)]


def _statfs_type(path: Path) -> int | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        buf = _Statfs()
        if libc().statfs(os.fsencode(path), ctypes.byref(buf)) != 0:
            return None
        return int(buf.f_type) & 0xFFFFFFFF
    except (OSError, AttributeError):
        return None


def _mountinfo_type(path: Path) -> str | None:
    try:
        text = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return None
    target = str(path.resolve())
    best, best_type = "", None
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(fields) < 5 or not rfields:
            continue
        mount = fields[4].replace("\\040", " ")
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best):
            best, best_type = mount, rfields[0]
    return best_type


def network_fs_type(path: Path) -> str | None:
    """The network filesystem ``path`` lives on (e.g. ``"nfs"``), or None if local."""
    magic = _statfs_type(path)
    if magic is not None:
        return _MAGIC.get(magic)
    fstype = _mountinfo_type(path)
    if fstype is None:
        return None
    base = fstype.split(".")[0].lower()  # "fuse.sshfs" -> "fuse"
    return base if base in _NAMES else None


def warn_if_network_fs(path: Path) -> str | None:
    """Warn once per directory when ``path`` is on a network filesystem; returns its type."""
    if allow_network_fs():
        return None
    fstype = network_fs_type(path)
    if fstype is None:
        return None
    key = str(path.parent)  # once per runs directory, not once per run
    with _warned_lock:
        if key in _warned:
            return fstype
        _warned.add(key)
    warnings.warn(
        f"the run journal {path} is on a network filesystem ({fstype}), where LMDB can "
        "corrupt or lose data; put runs on a node-local disk with runs_dir= or "
        f"PRIME_RUNS_DIR (set {ALLOW_ENV}=1 to silence this warning)",
        NetworkFilesystemWarning,
        stacklevel=3,
    )
    return fstype
