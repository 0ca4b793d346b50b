"""A file source's files: their records counted as `line.strip()` sees them, and a file changed after it was
fingerprinted never passes for the file it was, whether its SHA-256 was remembered or not; a directory lists the
files its pattern matches as `Path.rglob` does."""

from __future__ import annotations

import hashlib
import os
import random
import time
from pathlib import Path

import pytest

from onceflow.jobs.sources.checkpoint import SourceCheckpoint
from onceflow.resources import files
from onceflow.resources.files import FileChangedError, FileEntry, JsonLinesDirectory, fingerprint, records_in


def test_records_are_the_lines_with_something_on_them() -> None:
    pieces = [b'{"a": 1}', b"", b" ", b'\t{"b": 2}', b"\r", b" \r", b"x", b"  y  ", b"\x0b", b"{}"]
    rng = random.Random(7)
    for _ in range(3000):
        data = b"\n".join(rng.choice(pieces) for _ in range(rng.randrange(8))) + rng.choice([b"", b"\n", b"\r\n"])
        assert records_in(data) == sum(1 for line in data.split(b"\n") if line.strip()), data


def _aged(path: Path, content: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    """Write `content`, and let its status count as settled (not changed within a tick of the clock)."""
    path.write_bytes(content)
    time.sleep(0.05)  # past the file system clock's tick: a rewrite gets another change time
    monkeypatch.setattr(files._Digests, "RACY_NS", 0)


def test_a_file_rewritten_to_the_same_size_after_its_hash_was_remembered_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _aged(tmp_path / "a.jsonl", b'{"id": "1"}\n', monkeypatch)
    entry = fingerprint(tmp_path, "a.jsonl")
    directory = JsonLinesDirectory(tmp_path)
    assert directory.count(entry) == 1  # its SHA-256 is remembered by its status now
    (tmp_path / "a.jsonl").write_bytes(b'{"id": "2"}\n')  # same size; another change time
    with pytest.raises(FileChangedError, match=r"a\.jsonl changed after batch planning"):
        directory.check(entry)


def test_a_file_changed_within_the_tick_it_was_hashed_in_is_hashed_again(tmp_path: Path) -> None:
    """A status that changed within `RACY_NS` of its hash is never remembered: a rewrite in the same tick of the
    clock, even with the change time set back, is still told apart by its bytes."""
    path = tmp_path / "a.jsonl"
    path.write_bytes(b'{"id": "1"}\n')
    entry = fingerprint(tmp_path, "a.jsonl")
    stat = path.stat()
    path.write_bytes(b'{"id": "2"}\n')
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # the same size and modification time as before
    with pytest.raises(FileChangedError, match=r"a\.jsonl changed after batch planning"):
        JsonLinesDirectory(tmp_path).check(entry)


def test_a_version_hashed_before_is_fingerprinted_from_its_status_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "a.jsonl"
    _aged(path, b'{"id": "1"}\n', monkeypatch)
    entry = fingerprint(tmp_path, "a.jsonl")
    with monkeypatch.context() as unread:
        unread.setattr(Path, "read_bytes", lambda self: pytest.fail(f"{self} was read again"))
        assert fingerprint(tmp_path, "a.jsonl") == entry
    path.write_bytes(b'{"id": "22"}\n')  # another status: read and hashed again
    assert fingerprint(tmp_path, "a.jsonl") == FileEntry("a.jsonl", 13, hashlib.sha256(b'{"id": "22"}\n').hexdigest())


def test_a_directory_lists_what_rglob_matches_sorted_by_parts_without_following_links(tmp_path: Path) -> None:
    for rel in ("b.jsonl", "a-c/x.jsonl", "a/b/y.jsonl", "a/sub/z.jsonl", "sub/w.jsonl", "a/.h.jsonl", "a/n.json",
                "a/UP.JSONL"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b'{"id": "1"}\n')
    (tmp_path / "d.jsonl").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "a", target_is_directory=True)
    every = JsonLinesDirectory(tmp_path)
    # By parts, as paths sort: "a/..." before "a-c/..." although "-" sorts before "/" in a string.
    expected = ["a/.h.jsonl", "a/b/y.jsonl", "a/sub/z.jsonl", "a-c/x.jsonl", "b.jsonl", "sub/w.jsonl"]
    assert every.listed() == expected == [p.relative_to(tmp_path).as_posix() for p in sorted(tmp_path.rglob("*.jsonl"))
                                          if p.is_file() and "link" not in p.parts]
    assert [e.path for e in every.discover(set(), 100, 2**30)] == expected
    assert [e.path for e in every.discover({"a/.h.jsonl", "b.jsonl"}, 2, 2**30)] == ["a/b/y.jsonl", "a/sub/z.jsonl"]
    assert JsonLinesDirectory(tmp_path, "sub/*.jsonl").listed() == ["a/sub/z.jsonl", "sub/w.jsonl"]



def test_a_checkpoints_copy_to_change_shares_nothing_with_it() -> None:
    checkpoint = SourceCheckpoint(committed_batch=5, taken_files=["a.jsonl"], recent_batches=[(5, 1)],
                                  totals={"received": 1}, watermark={"streams": {"0": [1, 2]}})
    copied = checkpoint.copied()
    assert copied == checkpoint
    copied.took([FileEntry("b.jsonl", 1, "0" * 64)])
    copied.recent_batches.append((6, 2))
    copied.totals["received"] = 2
    copied.watermark["streams"]["0"].append(3)
    assert checkpoint == SourceCheckpoint(committed_batch=5, taken_files=["a.jsonl"], recent_batches=[(5, 1)],
                                          totals={"received": 1}, watermark={"streams": {"0": [1, 2]}})
    assert copied.taken_files == ["a.jsonl", "b.jsonl"]
