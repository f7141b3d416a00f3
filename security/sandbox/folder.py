"""The container folder as the host sees it (issue 34): what a run changed, how big it is, a file
read for the files API, and its removal — all without following a link the code planted (inside,
``/mnt/data/x -> /etc/shadow`` points nowhere; on the host it points at the host's file)."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from dataclasses import dataclass

from security.sandbox.base import FileChange, FileEntry

MAX_FILES = 10_000  # the most entries a folder scan lists (the quota still counts every file)


@dataclass(frozen=True, slots=True)
class FileStat:
    size: int
    mtime_ns: int
    ino: int


def scan(folder: str) -> tuple[dict[str, FileStat], int]:
    """(the first MAX_FILES regular files by relative path, the folder's total bytes); never follows links."""
    files: dict[str, FileStat] = {}
    total = 0
    for root, dirs, names in os.walk(folder, followlinks=False):
        for name in names + dirs:
            path = os.path.join(root, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            total += st.st_blocks * 512 if stat.S_ISREG(st.st_mode) else 0
            if stat.S_ISREG(st.st_mode) and len(files) < MAX_FILES:
                files[os.path.relpath(path, folder)] = FileStat(st.st_size, st.st_mtime_ns, st.st_ino)
    return files, total


def folder_bytes(folder: str) -> int:
    return scan(folder)[1]


def read_beneath(folder: str, relpath: str, max_bytes: int) -> bytes:
    """A regular file under ``folder``, opened component by component without following any link:
    the code inside can plant ``/mnt/data/x -> /etc/shadow``, which on the host would point at the
    host's file. Raises FileNotFoundError, IsADirectoryError/ValueError (not a regular file, too big)."""
    parts = [p for p in relpath.split("/") if p not in ("", ".")]
    if not parts or ".." in parts:
        raise ValueError(f"bad path {relpath!r}")
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for part in parts[:-1]:
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
        try:
            leaf = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise ValueError(f"{relpath!r} is a symbolic link") from e
            raise
    finally:
        os.close(fd)
    with os.fdopen(leaf, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{relpath!r} is not a regular file")
        if st.st_size > max_bytes:
            raise ValueError(f"{relpath!r} is {st.st_size} bytes, over {max_bytes}")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"{relpath!r} grew past {max_bytes} bytes")
    return data


def diff(before: dict[str, FileStat], after: dict[str, FileStat]) -> tuple[FileEntry, ...]:
    out = [
        FileEntry(p, FileChange.CREATED if p not in before else FileChange.MODIFIED, s.size)
        for p, s in sorted(after.items())
        if before.get(p) != s
    ]
    out += [FileEntry(p, FileChange.DELETED, 0) for p in sorted(before) if p not in after]
    return tuple(out)


def rmtree(path: str) -> None:
    def fix(func: object, p: str, exc: object) -> None:  # a folder the code made unreadable
        with contextlib.suppress(OSError):  # never chmod through a link the code planted
            if not os.path.islink(os.path.dirname(p)):
                os.chmod(os.path.dirname(p), 0o700)
            if not os.path.islink(p):
                os.chmod(p, 0o700)
        with contextlib.suppress(OSError):
            shutil.rmtree(p) if os.path.isdir(p) and not os.path.islink(p) else os.unlink(p)

    shutil.rmtree(path, onerror=fix)
