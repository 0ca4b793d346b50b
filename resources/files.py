"""A directory of JSON-lines files as a deterministic source.

Files are discovered in sorted order of their relative paths; each is fingerprinted (size and SHA-256) when a
batch takes it, and checked again when it is read, so a file that changed after it was taken is an error that
names it rather than a silent re-ingest. Writers should move finished files into the directory atomically. An
empty file is not taken until it has bytes: a producer that creates a file and then writes it (one write, as small
files are) is seen between the two, and an empty file holds no record anyway.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


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
        for path in sorted(self.directory.rglob(self.pattern)):
            rel = path.relative_to(self.directory).as_posix()
            if rel in taken or not path.is_file():
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

    def path_of(self, entry: FileEntry) -> str:
        return str(self.directory / entry.path)

    def check(self, entry: FileEntry) -> bytes:
        """The bytes of a taken file, which must be those it was planned with."""
        try:
            data = (self.directory / entry.path).read_bytes()
        except FileNotFoundError:
            raise FileChangedError(f"{entry.path} disappeared after batch planning") from None
        if len(data) != entry.size or hashlib.sha256(data).hexdigest() != entry.sha256:
            raise FileChangedError(
                f"{entry.path} changed after batch planning (planned {entry.size} bytes, sha256 "
                f"{entry.sha256[:12]}…; now {len(data)} bytes): files must be immutable once in the source directory"
            )
        return data

    def count(self, entry: FileEntry) -> int:
        """How many records (non-empty lines) a taken file holds."""
        return sum(1 for line in self.check(entry).split(b"\n") if line.strip())

    def lines(self, entry: FileEntry) -> Iterator[tuple[int, bytes]]:
        """`(byte offset, line without its newline)` for each non-empty line of a taken file."""
        data = self.check(entry)
        offset = 0
        for line in data.split(b"\n"):
            if line.strip():
                yield offset, line.rstrip(b"\r")
            offset += len(line) + 1


def fingerprint(directory: Path, rel: str) -> FileEntry:
    data = (directory / rel).read_bytes()
    return FileEntry(path=rel, size=len(data), sha256=hashlib.sha256(data).hexdigest())
