"""A directory of JSON-lines files as a deterministic source.

Files are discovered in sorted order of their relative paths; each is fingerprinted (size and SHA-256) when a
batch takes it, and checked again when it is read, so a file that changed after it was taken is an error that
names it rather than a silent re-ingest. Writers should move finished files into the directory atomically. An
empty file is not taken until it has bytes: a producer that creates a file and then writes it (one write, as small
files are) is seen between the two, and an empty file holds no record anyway.

A file's SHA-256 is computed once per version of its status (`_Digests`): a batch's files are fingerprinted when
the batch is proposed, planned and read, which hashed every byte three times; a fingerprint of a version hashed
before reads only the file's status.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class FileEntry:
    """A file as it was when a batch took it: a later change to it is detected, never silently re-read."""

    path: str
    size: int
    sha256: str


class FileChangedError(RuntimeError):
    """A file taken by a batch is not the file it was when the batch was planned."""


class JsonLinesDirectory:
    def __init__(self, directory: str | Path, pattern: str = "*.jsonl") -> None:
        self.directory = Path(directory).absolute()
        self.pattern = pattern

    def discover(self, taken: set[str], max_files: int, max_bytes: int) -> list[FileEntry]:
        """New non-empty files in sorted order, at least one and otherwise up to `max_files` / `max_bytes`."""
        entries: list[FileEntry] = []
        total = 0
        for rel in self.listed():
            if rel in taken or not (self.directory / rel).is_file():
                continue
            if entries and len(entries) >= max_files:  # before reading the next file whole to fingerprint it
                break
            entry = fingerprint(self.directory, rel)
            if not entry.size:
                continue
            if entries and total + entry.size > max_bytes:
                break
            entries.append(entry)
            total += entry.size
        return entries

    def listed(self) -> list[str]:
        """The relative paths of the files the pattern matches at any depth, as `Path.rglob` does (the pattern's
        parts match a path's last parts; links to directories are not followed), sorted by their parts.

        Listed as strings, each part's pattern compiled once: a directory that keeps its files is listed on every
        poll, and `Path.rglob` builds a path object and matches every pattern part anew for each file."""
        *above, last = (re.compile(fnmatch.translate(part)).match for part in self.pattern.split("/"))
        found: list[tuple[str, ...]] = []
        for top, _, names in os.walk(self.directory):
            rel = os.path.relpath(top, self.directory)
            prefix = () if rel == "." else tuple(rel.split(os.sep))
            if above and (len(prefix) < len(above)
                          or not all(m(d) for m, d in zip(above, prefix[-len(above):], strict=True))):
                continue
            found += ((*prefix, name) for name in names if last(name))
        return ["/".join(rel) for rel in sorted(found)]

    def path_of(self, entry: FileEntry) -> str:
        return str(self.directory / entry.path)

    def check(self, entry: FileEntry) -> bytes:
        """The bytes of a taken file, which must be those it was planned with."""
        try:
            data, sha256 = _DIGESTS.read(self.directory / entry.path)
        except FileNotFoundError:
            raise FileChangedError(f"{entry.path} disappeared after batch planning") from None
        if len(data) != entry.size or sha256 != entry.sha256:
            raise FileChangedError(
                f"{entry.path} changed after batch planning (planned {entry.size} bytes, sha256 "
                f"{entry.sha256[:12]}…; now {len(data)} bytes): files must be immutable once in the source directory"
            )
        return data

    def count(self, entry: FileEntry) -> int:
        """How many records (non-empty lines) a taken file holds."""
        return records_in(self.check(entry))

    def lines(self, entry: FileEntry) -> Iterator[tuple[int, bytes]]:
        """`(byte offset, line without its newline)` for each non-empty line of a taken file."""
        data = self.check(entry)
        offset = 0
        for line in data.split(b"\n"):
            if line.strip():
                yield offset, line.rstrip(b"\r")
            offset += len(line) + 1


def fingerprint(directory: Path, rel: str) -> FileEntry:
    size, sha256 = _DIGESTS.digest(directory / rel)
    return FileEntry(path=rel, size=size, sha256=sha256)


_SPACE = np.zeros(256, dtype=bool)
_SPACE[list(b" \t\n\r\x0b\x0c")] = True  # what `bytes.strip` strips


def records_in(data: bytes) -> int:
    """How many non-empty lines (`line.strip()`) `data` holds. Lines are found by numpy, not a loop over them; only
    one that begins with whitespace (rare in JSON lines) is looked at whole."""
    chars = np.frombuffer(data, dtype=np.uint8)
    starts = np.concatenate(([0], np.flatnonzero(chars == ord("\n")) + 1))
    starts = starts[starts < len(chars)]
    spaced = _SPACE[chars[starts]]
    count = len(starts) - int(spaced.sum())
    for start in starts[spaced].tolist():
        end = data.find(b"\n", start)
        count += bool(data[start : None if end < 0 else end].strip())
    return count


class _Digests:
    """SHA-256s of files by their status (size, times, inode): a file whose status is unchanged since it was hashed
    is not hashed again. The kernel sets a file's change time on every write, but only to the tick of its clock:
    a file whose status changed less than `RACY_NS` before it was hashed is hashed every time (git's "racy" index
    entries). The status is read before and after the bytes, so a file written meanwhile is hashed, not trusted."""

    RACY_NS = 2_000_000_000
    SIZE = 10_000

    def __init__(self) -> None:
        self._known: OrderedDict[tuple[int, ...], str] = OrderedDict()
        self._lock = threading.Lock()

    def digest(self, path: Path) -> tuple[int, str]:
        """The file's size and SHA-256, its bytes unread when its status is that of a version hashed before."""
        status = _status(path)
        with self._lock:
            known = self._known.get(status)
        if known is not None:
            return status[4], known
        data, sha256 = self.read(path)
        return len(data), sha256

    def read(self, path: Path) -> tuple[bytes, str]:
        """The file's bytes and their SHA-256."""
        before = _status(path)
        data = path.read_bytes()
        after = _status(path)
        with self._lock:
            known = self._known.get(before) if before == after else None
        if known is not None:
            return data, known
        sha256 = hashlib.sha256(data).hexdigest()
        if before == after and before[3] < time.time_ns() - self.RACY_NS:
            with self._lock:
                self._known[before] = sha256
                while len(self._known) > self.SIZE:
                    self._known.popitem(last=False)
        return data, sha256


def _status(path: Path) -> tuple[int, ...]:
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, st.st_size


_DIGESTS = _Digests()
