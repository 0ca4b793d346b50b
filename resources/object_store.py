"""Small durable key-value files on local disk or object storage, with the two writes exactly-once needs.

`write` replaces a key atomically (a reader sees the old or the new bytes, never a mix); `create` writes a key
only if it does not exist yet, so two writers racing for the same key cannot both win; `swap` replaces a key only
if it still holds what the writer read (`read_versioned`), a compare-and-swap. Local disk does this with a temp
file plus `os.replace` / `os.link` (and a lock file for `swap`); Google Cloud Storage with generation
preconditions.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Protocol


class ObjectStore(Protocol):
    """Keys are `/`-separated relative names chosen by the platform, never taken from message content."""

    uri: str

    def read(self, key: str) -> bytes | None: ...

    def exists(self, key: str) -> bool: ...

    def write(self, key: str, data: bytes) -> None: ...

    def create(self, key: str, data: bytes) -> bool: ...

    def read_versioned(self, key: str) -> tuple[bytes | None, str]:
        """The key's bytes (None if absent) and a token naming exactly that version, for `swap`."""
        ...

    def swap(self, key: str, data: bytes, token: str) -> bool:
        """Replace the key with `data` if it is still the version `token` names; False if it changed since."""
        ...

    def list(self, prefix: str) -> list[str]: ...

    def delete(self, key: str) -> None: ...

    def url(self, key: str) -> str: ...


def open_store(uri: str) -> ObjectStore:
    """`gs://bucket/prefix` opens Google Cloud Storage; anything else is a local directory."""
    if uri.startswith("gs://"):
        return GcsStore(uri)
    return LocalStore(uri)


class LocalStore:
    """A directory on local disk; every write is fsynced before it becomes visible."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).absolute()
        self.uri = str(self.root)

    def _path(self, key: str) -> Path:
        if key.startswith("/") or ".." in key.split("/"):
            raise ValueError(f"invalid store key {key!r}")
        return self.root / key

    def read(self, key: str) -> bytes | None:
        try:
            return self._path(key).read_bytes()
        except FileNotFoundError:
            return None

    def exists(self, key: str) -> bool:
        return self._path(key).is_file()

    def _temp(self, path: Path, data: bytes) -> str:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        return tmp

    def write(self, key: str, data: bytes) -> None:
        path = self._path(key)
        tmp = self._temp(path, data)
        os.replace(tmp, path)
        fsync_dir(path.parent)

    def create(self, key: str, data: bytes) -> bool:
        path = self._path(key)
        tmp = self._temp(path, data)
        try:
            os.link(tmp, path)  # fails if the key exists: the atomic "create if absent"
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
        fsync_dir(path.parent)
        return True

    def read_versioned(self, key: str) -> tuple[bytes | None, str]:
        data = self.read(key)
        return data, _digest(data)

    def swap(self, key: str, data: bytes, token: str) -> bool:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Every swapper of a key holds its lock file while it compares and replaces; readers need no lock, since
        # the replace itself is atomic.
        with open(path.parent / f".{path.name}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if _digest(self.read(key)) != token:
                return False
            self.write(key, data)
            return True

    def list(self, prefix: str) -> list[str]:
        base = self._path(prefix) if prefix else self.root
        if not base.exists():
            return []
        return sorted(
            str(p.relative_to(self.root))
            for p in base.rglob("*")
            if p.is_file() and not p.name.startswith(".")
        )

    def delete(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def url(self, key: str) -> str:
        return str(self._path(key))


def _digest(data: bytes | None) -> str:
    return "absent" if data is None else hashlib.sha256(data).hexdigest()


def fsync_dir(path: Path) -> None:
    """Make a rename or new file in `path` durable (its directory entry is data too)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class GcsStore:
    """A `gs://bucket/prefix` location; credentials come from Application Default Credentials."""

    def __init__(self, uri: str) -> None:
        from google.cloud import storage

        self.uri = uri.rstrip("/")
        bucket, _, prefix = uri.removeprefix("gs://").partition("/")
        self.prefix = prefix.strip("/")
        self.bucket = storage.Client().bucket(bucket)

    def _name(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def read(self, key: str) -> bytes | None:
        from google.api_core.exceptions import NotFound

        try:
            return self.bucket.blob(self._name(key)).download_as_bytes()
        except NotFound:
            return None

    def exists(self, key: str) -> bool:
        return self.bucket.blob(self._name(key)).exists()

    def write(self, key: str, data: bytes) -> None:
        self.bucket.blob(self._name(key)).upload_from_string(data)  # a GCS upload is atomic

    def create(self, key: str, data: bytes) -> bool:
        from google.api_core.exceptions import PreconditionFailed

        try:
            self.bucket.blob(self._name(key)).upload_from_string(data, if_generation_match=0)
        except PreconditionFailed:
            # The client retries uploads: a first attempt that succeeded but whose answer was lost makes the
            # retry fail its precondition. The object holding exactly our bytes means that attempt was ours.
            return self.read(key) == data
        return True

    def read_versioned(self, key: str) -> tuple[bytes | None, str]:
        from google.api_core.exceptions import NotFound

        blob = self.bucket.blob(self._name(key))
        try:
            data = blob.download_as_bytes()
        except NotFound:
            return None, "0"
        return data, str(blob.generation)

    def swap(self, key: str, data: bytes, token: str) -> bool:
        from google.api_core.exceptions import PreconditionFailed

        try:
            self.bucket.blob(self._name(key)).upload_from_string(data, if_generation_match=int(token))
        except PreconditionFailed:
            return self.read(key) == data  # as in `create`: a retried upload of ours that had succeeded
        return True

    def list(self, prefix: str) -> list[str]:
        start = len(self.prefix) + 1 if self.prefix else 0
        return sorted(b.name[start:] for b in self.bucket.list_blobs(prefix=self._name(prefix)))

    def delete(self, key: str) -> None:
        from google.api_core.exceptions import NotFound

        with contextlib.suppress(NotFound):
            self.bucket.blob(self._name(key)).delete()

    def url(self, key: str) -> str:
        return f"{self.uri}/{key}"
