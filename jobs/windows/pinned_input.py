"""A closed window's pinned input: readable only while the tables keep its raw version (`retention`)."""

from __future__ import annotations

import time

from onceflow.jobs.windows.panes import PaneClose, Window


class PinnedInputExpired(RuntimeError):
    """A closed window's pinned raw version is older than the tables keep versions."""


def check_pinned_input(asset: str, window: Window, close: PaneClose, retention_s: int, now_ms: int) -> None:
    """Raise `PinnedInputExpired` if the pane's pinned version may no longer be readable."""
    if now_ms - close.closed_at_ms > retention_s * 1000:
        closed = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(close.closed_at_ms / 1000))
        raise PinnedInputExpired(
            f"{asset} window {window.key} pane {close.pane} was closed at raw version {close.raw_version} on "
            f"{closed}; the tables keep versions for {retention_s // 3600} hours, so recomputing it now would read "
            "different input. Its committed and published result stands; it is not recomputed."
        )
