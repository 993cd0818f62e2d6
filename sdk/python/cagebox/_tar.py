"""Directory trees as tar streams, both ways. A tree from a sandbox is the
guest's word (it may be compromised): safe_extract checks every entry
itself, since Python 3.9's tarfile has no extraction filters."""

from __future__ import annotations

import os
import stat
import tarfile
from typing import IO, List, Tuple

MAX_BYTES = 1 << 30
MAX_ENTRIES = 100_000


class UnsafeArchive(ValueError):
    """An entry would land outside the destination, is a device node or
    FIFO, or the archive is over its limits."""


def _clean(name: str, what: str) -> str:
    if not name or "\x00" in name:
        raise UnsafeArchive(f"{what}: empty name or NUL in {name!r}")
    if name.startswith("/"):
        raise UnsafeArchive(f"{what}: absolute name {name!r}")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise UnsafeArchive(f"{what}: {name!r} leads out with ..")
    return "/".join(parts)


def _parent_dir(root: str, rel: str) -> str:
    """The directory holding rel under root, checked component by component:
    it must exist (made by an earlier entry) and no component may be a
    symlink, so nothing is written through one."""
    d = root
    for part in rel.split("/")[:-1]:
        d = os.path.join(d, part)
        try:
            st = os.lstat(d)
        except FileNotFoundError:
            raise UnsafeArchive(f"{rel!r}: its directory {part!r} is not in the archive before it") from None
        if stat.S_ISLNK(st.st_mode):
            raise UnsafeArchive(f"{rel!r} goes through a symlink")
        if not stat.S_ISDIR(st.st_mode):
            raise UnsafeArchive(f"{rel!r}: {part!r} is not a directory")
    return d


def _remove_non_dir(p: str) -> None:
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        raise UnsafeArchive(f"{p!r}: a directory is in the way")
    os.unlink(p)


def safe_extract(stream: IO[bytes], dest: str, max_bytes: int = MAX_BYTES, max_entries: int = MAX_ENTRIES) -> int:
    """Extracts the tar stream under dest (created if missing); returns the
    number of entries. Refuses (UnsafeArchive) absolute names, "..",
    anything written through a symlink, hard links to outside, device nodes
    and FIFOs, more than max_bytes of files or max_entries entries. What
    was extracted before a refusal stays."""
    os.makedirs(dest, exist_ok=True)
    root = os.path.realpath(dest)
    total, count = 0, 0
    dirs: List[Tuple[str, int, float]] = []
    with tarfile.open(fileobj=stream, mode="r|") as tf:
        for m in tf:
            count += 1
            if count > max_entries:
                raise UnsafeArchive(f"more than {max_entries} entries")
            if m.ischr() or m.isblk():
                raise UnsafeArchive(f"{m.name!r} is a device node (refused)")
            if m.isfifo():
                raise UnsafeArchive(f"{m.name!r} is a FIFO (refused)")
            rel = _clean(m.name, "entry")
            if rel == "":
                if m.isdir():
                    dirs.append((root, m.mode & 0o7777, m.mtime))
                    continue
                raise UnsafeArchive("the root entry is not a directory")
            parent = _parent_dir(root, rel)
            target = os.path.join(parent, rel.rsplit("/", 1)[-1])
            if m.isdir():
                try:
                    os.mkdir(target, 0o700)
                except FileExistsError:
                    if not stat.S_ISDIR(os.lstat(target).st_mode):
                        raise UnsafeArchive(f"{rel!r} is a directory in the archive but another kind of file here") from None
                dirs.append((target, m.mode & 0o7777, m.mtime))
            elif m.isreg():
                if m.size < 0 or m.size > max_bytes - total:
                    raise UnsafeArchive(f"{rel!r} would take the files past {max_bytes} bytes")
                total += m.size
                _remove_non_dir(target)
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
                with os.fdopen(fd, "wb") as out:
                    src = tf.extractfile(m)
                    left = m.size
                    while left > 0 and src is not None:
                        b = src.read(min(left, 1 << 20))
                        if not b:
                            break
                        out.write(b)
                        left -= len(b)
                    os.fchmod(out.fileno(), m.mode & 0o7777)
                os.utime(target, (m.mtime, m.mtime), follow_symlinks=False)
            elif m.issym():
                if not m.linkname or "\x00" in m.linkname:
                    raise UnsafeArchive(f"symlink {rel!r} has an empty target")
                _remove_non_dir(target)
                # It may point anywhere: nothing here follows it.
                os.symlink(m.linkname, target)
            elif m.islnk():
                lrel = _clean(m.linkname, "hard link target")
                if lrel == "":
                    raise UnsafeArchive(f"hard link {rel!r} to the root")
                lparent = _parent_dir(root, lrel)
                _remove_non_dir(target)
                os.link(os.path.join(lparent, lrel.rsplit("/", 1)[-1]), target, follow_symlinks=False)
            else:
                raise UnsafeArchive(f"{rel!r}: entry type {m.type!r} is not supported")
    for d, mode, mtime in reversed(dirs):
        os.chmod(d, mode)
        os.utime(d, (mtime, mtime))
    return count


def write_tree(out: IO[bytes], src: str) -> None:
    """Writes src (a directory's contents, or one file) as a tar stream:
    symlinks as links; device nodes, FIFOs and sockets skipped."""

    def keep(ti: tarfile.TarInfo) -> "tarfile.TarInfo | None":
        if ti.isdev():  # chr, blk, fifo
            return None
        return ti

    with tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as tf:
        if os.path.isdir(src) and not os.path.islink(src):
            tf.add(src, arcname=".", recursive=True, filter=keep)
        else:
            tf.add(src, arcname=os.path.basename(src), recursive=False, filter=keep)
