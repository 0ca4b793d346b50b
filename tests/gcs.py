"""A proxy in front of the GCS emulator that can lose the answer to an upload the emulator did perform."""

from __future__ import annotations

from collections.abc import Callable

from onceflow.resources.emulators.gcs_shim import Answer, LoopbackProxy


class LossyProxy(LoopbackProxy):
    """Forwards every request to `upstream`; a request for which `lose(method, path, body)` is true the first time
    is performed upstream, but its answer is replaced by a 503, so the client retries something already done."""

    def __init__(self, upstream: str, lose: Callable[[str, str, bytes], bool]) -> None:
        super().__init__(upstream)
        self.lose = lose
        self.lost: list[str] = []

    def answer(self, method: str, path: str, headers: dict[str, str], body: bytes) -> Answer:
        answer = self.forward(method, path, headers, body)
        if self.lose(method, path, body) and path not in self.lost:
            self.lost.append(path)
            return 503, [], b""
        return answer
