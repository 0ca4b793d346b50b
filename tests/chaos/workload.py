"""The chaos harness's `orders` traffic: orders with publisher retries and malformed messages, every ID sent
recorded so the end state can be checked against it."""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field

from onceflow.orchestration.workload import Worker
from onceflow.resources.pubsub import PubSubClient

MALFORMED_ORDERS = [
    b'{"region": "eu", "amount": 1}',  # no customer
    b'{"customer": "c", "region": "eu", "amount": "twelve"}',  # amount is not a decimal
    b'{"customer": "c", "region": "eu", "amount": true}',  # amount is a boolean
    b"not json",
]


@dataclass
class Sent:
    valid_ids: set[str] = field(default_factory=set)
    malformed_ids: set[str] = field(default_factory=set)
    messages: int = 0


class OrderPublisher(Worker):
    def __init__(self, client: PubSubClient, duration_s: float, rate: int, seed: int) -> None:
        super().__init__()
        self.client, self.duration_s, self.rate, self.rng = client, duration_s, rate, random.Random(seed)
        self.sent = Sent()

    def work(self) -> None:
        start, seq, recent = time.time(), 0, []
        while time.time() - start < self.duration_s:
            tick = time.time()
            now_ms = int(tick * 1000)
            messages = []
            for _ in range(self.rate):
                seq += 1
                body = {"customer": f"c{self.rng.randrange(6)}", "region": self.rng.choice(["eu", "us", "apac"]),
                        "amount": self.rng.randrange(100, 10_000) / 100}
                attributes = {"order_id": f"o{seq}", "ts": str(now_ms - self.rng.randrange(2000))}
                messages.append((json.dumps(body).encode(), attributes))
                self.sent.valid_ids.add(f"o{seq}")
                recent.append(messages[-1])
            recent = recent[-20:]
            if self.rng.random() < 0.5:  # a publisher retry of a recent order
                messages.append(self.rng.choice(recent))
            if self.rng.random() < 0.2:
                seq += 1
                messages.append((self.rng.choice(MALFORMED_ORDERS), {"order_id": f"bad-o{seq}", "ts": str(now_ms)}))
                self.sent.malformed_ids.add(f"bad-o{seq}")
            self.client.publish("onceflow-orders", messages)
            self.sent.messages += len(messages)
            time.sleep(max(0.0, 1.0 - (time.time() - tick)))
