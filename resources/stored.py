"""Versioned documents: the base of everything onceflow keeps in its stores (checkpoints, batch plans, pane
closes, commit sequences and their state).

Each stored document is a `Stored` model whose `version` field names its format. A document is written as sorted,
human-readable JSON (`to_json`) and read back only through `Stored.load`, which

- reads documents written before formats had versions (no `version` field: format 0) and every older format,
  bringing each up to date through the model's `upgrade` hook;
- raises `UnknownStateVersion`, naming where the document lives, for a format newer than this code knows (a home
  written by a newer onceflow): never a guess at what its fields mean;
- raises `InvalidStoredState`, naming where, for a document that does not match its format.

A model changes its format by declaring `version: int = <next>` and teaching `upgrade` the step from the one before;
field names stay as they are on disk.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, ValidationError

UNVERSIONED = 0
"""The format of a document written before documents carried a `version`."""


class StoredStateError(ValueError):
    """A stored document that this code cannot read; `where` names its store and key."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where


class UnknownStateVersion(StoredStateError):
    """A stored document in a format newer than this code knows: written by a newer onceflow."""

    def __init__(self, where: str, model: str, found: object, known: int) -> None:
        super().__init__(where, f"{model} format version {found!r} is unknown (this onceflow reads versions up to "
                                f"{known}): the home was written by a newer onceflow; run that one, or upgrade")
        self.model, self.found, self.known = model, found, known


class InvalidStoredState(StoredStateError):
    """A stored document that does not match its format (torn, edited by hand, or not onceflow's)."""


class Stored(BaseModel):
    """A document onceflow stores: frozen, no fields beyond those declared, `version` its format."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: int = 1

    @classmethod
    def format_version(cls) -> int:
        """The format this code writes (and the newest it reads)."""
        return cls.model_fields["version"].default

    @classmethod
    def upgrade(cls, raw: dict[str, Any], version: int) -> dict[str, Any]:
        """`raw`, a document of format `version` (older than `format_version()`), as the current format has it.

        The default suits a format that only added `version` to the one before (format 0 to 1)."""
        return raw

    @classmethod
    def load(cls, data: bytes | str | Mapping[str, Any], where: str) -> Self:
        """The document `data` (JSON text, or the object it holds) stored at `where` (its store and key, for errors),
        in the current format whatever format it was written in."""
        try:
            raw = json.loads(data) if isinstance(data, bytes | str) else dict(data)
        except ValueError as e:
            raise InvalidStoredState(where, f"not JSON: {e}") from None
        if not isinstance(raw, dict):
            raise InvalidStoredState(where, f"a {cls.__name__} is a JSON object, found {type(raw).__name__}")
        found, known = raw.get("version", UNVERSIONED), cls.format_version()
        if type(found) is not int or not UNVERSIONED <= found <= known:
            raise UnknownStateVersion(where, cls.__name__, found, known)
        if found < known:
            raw = {**cls.upgrade(raw, found), "version": known}
        try:
            return cls.model_validate(raw)
        except ValidationError as e:
            raise InvalidStoredState(where, f"not a valid {cls.__name__} of format {known}: {e}") from None

    def to_dict(self) -> dict[str, Any]:
        """The document as JSON values (what `to_json` writes, and `load` reads back)."""
        return self.model_dump(mode="json")

    def to_json(self) -> bytes:
        return json.dumps(self.to_dict(), sort_keys=True).encode()
