"""A FUSE passthrough filesystem that can lose power: what was not synced is lost.

Why it exists: a journal's durability promise ("fsync": every call that
returned survives a power cut; "process": the log survives a crash of the
process, and after a power cut recovers to a prefix of what was written) can
only be tested against a disk that really forgets. Killing a process keeps
the page cache, so it never shows a missing ``fsync``. This file system keeps
every write in memory until the file is synced (``fsync``, ``fdatasync``,
``msync`` of a shared map: all reach it as FUSE_FSYNC; a write through an
``O_DSYNC`` or ``O_SYNC`` descriptor is synced as made), and on a *cut*
discards what was not.

It speaks the FUSE protocol itself over ``/dev/fuse`` (root only; no libfuse
binding is needed), single-threaded: each request is answered before the next
is read, so a cut falls between two requests and is atomic.

The model of the disk (strict, as a power cut may be):
- The backing directory is the disk. A file's bytes reach it only when the
  file is synced; until then they live in memory, and readers see them.
- Names are durable at once (create, unlink, rename, mkdir reach the backing
  directory when made): a file created or renamed and never synced is there
  after the cut, with what was last synced (empty if never). This is the
  worst case for a delete (a file deleted before what replaces it was synced).
- On a cut, in mode ``drop`` every unsynced write is lost. In mode ``torn``
  each file keeps the writes made to it up to a random point, in order, the
  last one possibly cut at a 512-byte boundary of the file (writeback got
  that far); no
  order holds between files.

Usage (a child process of the test, commands on stdin, answers on stdout):
    python cutfs.py BACKING MOUNTPOINT [--mode drop|torn] [--seed N] [--cut-on-unlink PREFIX]
prints ``ready`` once mounted; on ``cut`` (or, with ``--cut-on-unlink PREFIX``,
right after a file named so is deleted) it discards and prints ``cut``, then
answers nothing more (the processes using it hang until killed); on ``exit``
(or end of input) it unmounts (lazily) and exits.
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import os
import random
import select
import stat
import struct
import sys
from dataclasses import dataclass, field

# FUSE opcodes used here (linux/fuse.h).
LOOKUP, FORGET, GETATTR, SETATTR, READLINK, SYMLINK = 1, 2, 3, 4, 5, 6
MKNOD, MKDIR, UNLINK, RMDIR, RENAME, LINK, OPEN, READ, WRITE = 8, 9, 10, 11, 12, 13, 14, 15, 16
STATFS, RELEASE, FSYNC, FLUSH, INIT, OPENDIR, READDIR = 17, 18, 20, 25, 26, 27, 28
RELEASEDIR, FSYNCDIR, ACCESS, CREATE, INTERRUPT, DESTROY = 29, 30, 34, 35, 36, 38
BATCH_FORGET, RENAME2 = 42, 45

IN_HEADER = struct.Struct("<IIQQIIIHH")
OUT_HEADER = struct.Struct("<IiQ")
ATTR = struct.Struct("<QQQQQQIIIIIIIIII")
ENTRY_HEAD = struct.Struct("<QQQQII")
ATTR_OUT_HEAD = struct.Struct("<QII")
SETATTR_IN = struct.Struct("<IIQQQQQQIIIIIIII")
READ_IN = struct.Struct("<QQIIQII")
WRITE_IN = struct.Struct("<QQIIQII")
OPEN_OUT = struct.Struct("<QII")
DIRENT = struct.Struct("<QQII")
INIT_OUT = struct.Struct("<IIIIHHIIHHI7I")

FATTR_MODE, FATTR_UID, FATTR_GID, FATTR_SIZE = 1, 2, 4, 8
FATTR_ATIME, FATTR_MTIME, FATTR_ATIME_NOW, FATTR_MTIME_NOW = 16, 32, 128, 256
FUSE_BIG_WRITES, FUSE_MAX_PAGES = 1 << 5, 1 << 22
MAX_WRITE = 1 << 20
VALID_S = 1  # seconds the kernel may cache names and attributes (it sees every change)
TORN_UNIT = 512


@dataclass
class Content:
    """A file's bytes as readers see them, and the writes not yet synced."""

    data: bytearray
    fd: int  # the backing file, open for writing (a sync or a cut writes through it)
    pending: list[tuple[int, bytes | None, int]] = field(default_factory=list)
    # (offset, bytes, 0) for a write; (size, None, 0) for a truncation


class CutFS:
    def __init__(
        self, backing: str, mode: str, seed: int, cut_on_unlink: str | None = None
    ) -> None:
        self.backing = os.path.realpath(backing)
        # Cut right after a file whose name starts with this is deleted.
        self.cut_on_unlink = cut_on_unlink
        self.due = False
        self.mode = mode
        self.rng = random.Random(seed)
        self.paths: dict[int, str] = {1: self.backing}  # node id -> backing path
        self.nodes: dict[int, int] = {}  # backing inode -> node id
        self.next_node = 2
        self.handles: dict[int, int] = {}  # fh -> backing fd
        self.handle_ino: dict[int, int] = {}
        self.handle_flags: dict[int, int] = {}  # the flags each was opened with
        self.dirs: dict[int, list[tuple[int, int, str]]] = {}
        self.next_fh = 1
        self.contents: dict[int, Content] = {}  # backing inode -> content
        self.open_count: dict[int, int] = {}

    # -- names ------------------------------------------------------------
    def node_for(self, path: str, st: os.stat_result) -> int:
        node = self.nodes.get(st.st_ino)
        if node is None:
            node = self.nodes[st.st_ino] = self.next_node
            self.next_node += 1
        self.paths[node] = path
        return node

    def path(self, node: int) -> str:
        try:
            return self.paths[node]
        except KeyError:
            raise OSError(errno.ENOENT, "stale node") from None

    def attr(self, st: os.stat_result) -> bytes:
        size = st.st_size
        content = self.contents.get(st.st_ino)
        if content is not None and stat.S_ISREG(st.st_mode):
            size = len(content.data)
        node = self.nodes.get(st.st_ino, st.st_ino)
        return ATTR.pack(
            node, size, (size + 511) // 512, int(st.st_atime), int(st.st_mtime),
            int(st.st_ctime), st.st_atime_ns % 10**9, st.st_mtime_ns % 10**9,
            st.st_ctime_ns % 10**9, st.st_mode, st.st_nlink, st.st_uid, st.st_gid,
            st.st_rdev, 4096, 0,
        )  # fmt: skip

    def entry(self, path: str) -> bytes:
        st = os.lstat(path)
        node = self.node_for(path, st)
        return ENTRY_HEAD.pack(node, 0, VALID_S, VALID_S, 0, 0) + self.attr(st)

    def attr_out(self, st: os.stat_result) -> bytes:
        return ATTR_OUT_HEAD.pack(VALID_S, 0, 0) + self.attr(st)

    def forget_name(self, path: str) -> None:
        """``path`` is about to go: a later file there is another node."""
        try:
            st = os.lstat(path)
        except OSError:
            return
        if st.st_nlink <= 1 or stat.S_ISDIR(st.st_mode):
            node = self.nodes.pop(st.st_ino, None)
            if node is not None:
                self.paths.pop(node, None)
            if not self.open_count.get(st.st_ino):
                self.drop_content(st.st_ino)

    def drop_content(self, ino: int) -> None:
        content = self.contents.pop(ino, None)
        if content is not None:
            os.close(content.fd)

    # -- contents ---------------------------------------------------------
    def content(self, ino: int, fd: int) -> Content:
        content = self.contents.get(ino)
        if content is None:
            size = os.fstat(fd).st_size
            data = bytearray(os.pread(fd, size, 0)) if size else bytearray()
            content = self.contents[ino] = Content(data, os.dup(fd))
        return content

    def write(self, content: Content, offset: int, data: bytes) -> None:
        end = offset + len(data)
        if end > len(content.data):
            content.data.extend(bytes(end - len(content.data)))
        content.data[offset:end] = data
        content.pending.append((offset, data, 0))

    def truncate(self, content: Content, size: int) -> None:
        if size < len(content.data):
            del content.data[size:]
        else:
            content.data.extend(bytes(size - len(content.data)))
        content.pending.append((size, None, 0))

    @staticmethod
    def apply(content: Content, ops: list[tuple[int, bytes | None, int]]) -> None:
        for offset, data, _ in ops:
            if data is None:
                os.ftruncate(content.fd, offset)
            else:
                os.pwrite(content.fd, data, offset)

    def sync(self, content: Content) -> None:
        self.apply(content, content.pending)
        content.pending = []

    def cut(self) -> dict[str, int]:
        """Power off: each file's unsynced writes are lost (``torn``: all but
        a random prefix of them)."""
        lost = {"files": 0, "writes": 0}
        for content in self.contents.values():
            if not content.pending:
                continue
            lost["files"] += 1
            keep = 0
            if self.mode == "torn":
                keep = self.rng.randint(0, len(content.pending))
                if keep < len(content.pending):
                    offset, data, _ = content.pending[keep]
                    # Torn at a sector boundary inside it, if it crosses one.
                    first = -(-(offset + 1) // TORN_UNIT) * TORN_UNIT
                    bounds = range(first, offset + len(data or b""), TORN_UNIT)
                    if data is not None and bounds:
                        cut_at = self.rng.choice(bounds)
                        content.pending[keep] = (offset, data[: cut_at - offset], 0)
                        keep += 1
            lost["writes"] += len(content.pending) - keep
            self.apply(content, content.pending[:keep])
            content.pending = []
        return lost

    # -- requests ---------------------------------------------------------
    def handle(self, opcode: int, node: int, body: bytes) -> bytes | None:
        """The reply's payload for one request (None: no reply is due)."""
        if opcode in (FORGET, BATCH_FORGET, INTERRUPT):
            return None
        if opcode == INIT:
            _major, minor, readahead, _flags = struct.unpack_from("<IIII", body)
            flags = FUSE_BIG_WRITES | FUSE_MAX_PAGES
            return INIT_OUT.pack(7, min(minor, 31), readahead, flags, 16, 12, MAX_WRITE, 1,
                                 MAX_WRITE // 4096, 0, 0, *([0] * 7))  # fmt: skip
        if opcode == DESTROY:
            return b""
        if opcode == LOOKUP:
            return self.entry(os.path.join(self.path(node), _name(body)))
        if opcode == GETATTR:
            _, _, fh = struct.unpack_from("<IIQ", body)
            try:
                return self.attr_out(os.lstat(self.path(node)))
            except OSError:
                if fh in self.handles:
                    return self.attr_out(os.fstat(self.handles[fh]))
                raise
        if opcode == SETATTR:
            return self.setattr(node, body)
        if opcode == READLINK:
            return os.readlink(self.path(node)).encode()
        if opcode == SYMLINK:
            name, target = body.split(b"\0")[:2]
            path = os.path.join(self.path(node), name.decode())
            os.symlink(target.decode(), path)
            return self.entry(path)
        if opcode == MKNOD:
            mode, rdev, umask, _ = struct.unpack_from("<IIII", body)
            path = os.path.join(self.path(node), _name(body[16:]))
            os.mknod(path, mode & ~umask, rdev)
            return self.entry(path)
        if opcode == MKDIR:
            mode, umask = struct.unpack_from("<II", body)
            path = os.path.join(self.path(node), _name(body[8:]))
            os.mkdir(path, mode & ~umask)
            return self.entry(path)
        if opcode in (UNLINK, RMDIR):
            path = os.path.join(self.path(node), _name(body))
            self.forget_name(path)
            (os.unlink if opcode == UNLINK else os.rmdir)(path)
            if self.cut_on_unlink and _name(body).startswith(self.cut_on_unlink):
                self.due = True
            return b""
        if opcode in (RENAME, RENAME2):
            newdir = struct.unpack_from("<Q", body)[0]
            names = body[8 if opcode == RENAME else 16 :].split(b"\0")
            flags = struct.unpack_from("<I", body, 8)[0] if opcode == RENAME2 else 0
            if flags:
                raise OSError(errno.EINVAL, "rename flags")
            old = os.path.join(self.path(node), names[0].decode())
            new = os.path.join(self.path(newdir), names[1].decode())
            self.forget_name(new)
            os.rename(old, new)
            for other, path in list(self.paths.items()):
                if path == old or path.startswith(old + "/"):
                    self.paths[other] = new + path[len(old) :]
            return b""
        if opcode == LINK:
            (old_node,) = struct.unpack_from("<Q", body)
            path = os.path.join(self.path(node), _name(body[8:]))
            os.link(self.path(old_node), path)
            return self.entry(path)
        if opcode in (OPEN, CREATE):
            return self.open(opcode, node, body)
        if opcode == READ:
            fh, offset, size, *_ = READ_IN.unpack_from(body)
            fd = self.handles[fh]
            content = self.contents.get(self.handle_ino[fh])
            if content is None:
                return os.pread(fd, size, offset)
            return bytes(content.data[offset : offset + size])
        if opcode == WRITE:
            fh, offset, size, _, _, flags, _ = WRITE_IN.unpack_from(body)
            content = self.content(self.handle_ino[fh], self.handles[fh])
            self.write(content, offset, body[WRITE_IN.size : WRITE_IN.size + size])
            if (flags | self.handle_flags.get(fh, 0)) & (os.O_DSYNC | os.O_SYNC):
                self.sync(content)  # a write through O_DSYNC (LMDB's meta pages)
            return struct.pack("<II", size, 0)
        if opcode == STATFS:
            s = os.statvfs(self.backing)
            counts = (s.f_blocks, s.f_bfree, s.f_bavail, s.f_files, s.f_ffree)
            return struct.pack("<QQQQQIIII6I", *counts, s.f_bsize, s.f_namemax, s.f_frsize, 0,
                               *([0] * 6))  # fmt: skip
        if opcode == RELEASE:
            (fh,) = struct.unpack_from("<Q", body)
            self.release(fh)
            return b""
        if opcode == FSYNC:
            (fh,) = struct.unpack_from("<Q", body)
            content = self.contents.get(self.handle_ino.get(fh, -1))
            if content is not None:
                self.sync(content)
            return b""
        if opcode in (FLUSH, FSYNCDIR, ACCESS, RELEASEDIR):
            if opcode == RELEASEDIR:
                self.dirs.pop(struct.unpack_from("<Q", body)[0], None)
            return b""
        if opcode == OPENDIR:
            path = self.path(node)
            listing = [(1, stat.S_IFDIR, "."), (1, stat.S_IFDIR, "..")]
            with os.scandir(path) as it:
                for item in it:
                    st = item.stat(follow_symlinks=False)
                    listing.append((st.st_ino, stat.S_IFMT(st.st_mode), item.name))
            fh = self.next_fh
            self.next_fh += 1
            self.dirs[fh] = listing
            return OPEN_OUT.pack(fh, 0, 0)
        if opcode == READDIR:
            fh, offset, size, *_ = READ_IN.unpack_from(body)
            out = b""
            for index in range(offset, len(self.dirs.get(fh, []))):
                ino, kind, entry_name = self.dirs[fh][index]
                raw = entry_name.encode()
                record = DIRENT.pack(ino, index + 1, len(raw), kind >> 12) + raw
                record += b"\0" * (-len(record) % 8)
                if len(out) + len(record) > size:
                    break
                out += record
            return out
        raise OSError(errno.ENOSYS, "not implemented")

    def setattr(self, node: int, body: bytes) -> bytes:
        fields = SETATTR_IN.unpack_from(body)
        valid, fh, size = fields[0], fields[2], fields[3]
        atime, mtime, mode, uid, gid = fields[5], fields[6], fields[11], fields[13], fields[14]
        fd = self.handles.get(fh) if valid & 64 else None
        path = self.paths.get(node)
        if fd is None and path is None:
            raise OSError(errno.ENOENT, "stale node")
        target: int | str = fd if fd is not None else str(path)
        if valid & FATTR_MODE:
            os.chmod(target, stat.S_IMODE(mode))
        if valid & (FATTR_UID | FATTR_GID):
            os.chown(target, uid if valid & FATTR_UID else -1, gid if valid & FATTR_GID else -1)
        if valid & FATTR_SIZE:
            opened = fd if fd is not None else os.open(str(path), os.O_RDWR | os.O_CLOEXEC)
            try:
                ino = os.fstat(opened).st_ino
                self.truncate(self.content(ino, opened), size)
            finally:
                if fd is None:
                    os.close(opened)
        if valid & (FATTR_ATIME | FATTR_MTIME | FATTR_ATIME_NOW | FATTR_MTIME_NOW):
            st = os.fstat(target) if isinstance(target, int) else os.lstat(target)
            now = None if valid & (FATTR_ATIME_NOW | FATTR_MTIME_NOW) else (
                atime if valid & FATTR_ATIME else st.st_atime,
                mtime if valid & FATTR_MTIME else st.st_mtime)  # fmt: skip
            os.utime(target, now)
        st = os.fstat(fd) if fd is not None else os.lstat(str(path))
        return self.attr_out(st)

    def open(self, opcode: int, node: int, body: bytes) -> bytes:
        if opcode == CREATE:
            flags, mode, umask, _ = struct.unpack_from("<IIII", body)
            path = os.path.join(self.path(node), _name(body[16:]))
            existed = os.path.exists(path)
            fd = os.open(path, (flags | os.O_CREAT) & ~(os.O_TRUNC | os.O_APPEND | os.O_ACCMODE)
                         | os.O_RDWR | os.O_CLOEXEC, mode & ~umask)  # fmt: skip
        else:
            (flags,) = struct.unpack_from("<I", body)
            path = self.path(node)
            existed = True
            access = os.O_RDWR if not stat.S_ISDIR(os.lstat(path).st_mode) else os.O_RDONLY
            try:
                fd = os.open(path, access | os.O_CLOEXEC | os.O_NOFOLLOW)
            except PermissionError:
                fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        st = os.fstat(fd)
        if existed and flags & os.O_TRUNC and opcode == CREATE:
            self.truncate(self.content(st.st_ino, fd), 0)
        fh = self.next_fh
        self.next_fh += 1
        self.handles[fh] = fd
        self.handle_ino[fh] = st.st_ino
        self.handle_flags[fh] = flags
        self.open_count[st.st_ino] = self.open_count.get(st.st_ino, 0) + 1
        out = OPEN_OUT.pack(fh, 0, 0)
        return self.entry(path) + out if opcode == CREATE else out

    def release(self, fh: int) -> None:
        fd = self.handles.pop(fh, None)
        ino = self.handle_ino.pop(fh, None)
        self.handle_flags.pop(fh, None)
        if fd is None or ino is None:
            return
        self.open_count[ino] -= 1
        try:
            gone = os.fstat(fd).st_nlink == 0
        except OSError:
            gone = True
        os.close(fd)
        if not self.open_count[ino]:
            del self.open_count[ino]
            if gone:
                self.drop_content(ino)


def _name(body: bytes) -> str:
    return body.split(b"\0", 1)[0].decode()


def _mount(mountpoint: str) -> int:
    fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
    libc = ctypes.CDLL(None, use_errno=True)
    options = f"fd={fd},rootmode=40000,user_id=0,group_id=0,allow_other".encode()
    ms_nosuid, ms_nodev = 2, 4
    if libc.mount(b"cutfs", mountpoint.encode(), b"fuse.cutfs", ms_nosuid | ms_nodev, options):
        err = ctypes.get_errno()
        raise OSError(err, f"mount {mountpoint}: {os.strerror(err)}")
    return fd


def _unmount(mountpoint: str) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.umount2(mountpoint.encode(), 2)  # MNT_DETACH


def serve(fs: CutFS, dev: int, control: int, mountpoint: str) -> None:
    cut = False
    pending = b""
    while True:
        if fs.due and not cut:
            cut = True
            lost = fs.cut()
            print(f"cut {lost['files']} {lost['writes']}", flush=True)
        ready, _, _ = select.select([control] if cut else [dev, control], [], [])
        if control in ready:
            chunk = os.read(control, 4096)
            pending += chunk
            if not chunk:
                break
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                if line == b"cut" and not cut:
                    cut = True
                    lost = fs.cut()
                    print(f"cut {lost['files']} {lost['writes']}", flush=True)
                elif line == b"exit":
                    _unmount(mountpoint)
                    return
            continue
        try:
            request = os.read(dev, MAX_WRITE + 65536)
        except OSError as exc:
            if exc.errno in (errno.EINTR, errno.EAGAIN, errno.ENOENT):
                continue
            if exc.errno == errno.ENODEV:  # unmounted
                return
            raise
        _length, opcode, unique, node, *_ = IN_HEADER.unpack_from(request)
        body = request[IN_HEADER.size :]
        try:
            payload = fs.handle(opcode, node, body)
            error = 0
        except OSError as exc:
            payload, error = b"", -(exc.errno or errno.EIO)
        except Exception as exc:  # a bug here must not hang the test: say it, answer EIO
            print(f"cutfs: opcode {opcode}: {exc!r}", file=sys.stderr, flush=True)
            payload, error = b"", -errno.EIO
        if payload is None:
            continue
        reply = OUT_HEADER.pack(OUT_HEADER.size + len(payload), error, unique) + payload
        try:
            os.write(dev, reply)
        except OSError as exc:
            if exc.errno != errno.ENOENT:  # ENOENT: the request was interrupted
                raise
    _unmount(mountpoint)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("backing")
    parser.add_argument("mountpoint")
    parser.add_argument("--mode", choices=("drop", "torn"), default="drop")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cut-on-unlink", metavar="PREFIX")
    args = parser.parse_args()
    fs = CutFS(args.backing, args.mode, args.seed, args.cut_on_unlink)
    dev = _mount(args.mountpoint)
    print("ready", flush=True)
    serve(fs, dev, sys.stdin.fileno(), args.mountpoint)


if __name__ == "__main__":
    main()
