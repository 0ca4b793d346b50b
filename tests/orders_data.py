"""Test data for the `orders` pipelines: orders with retries, bad records of each kind, and the expected
`region_sales` rows, computed in plain Python."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

WINDOW_MS = 5 * 60_000

# Bad lines, each with the dead-letter reason it must get and the field its detail must name.
BAD_ORDERS: list[tuple[str, str, dict]] = [
    ("missing_field", "`customer`", {"order_id": "bad-1", "region": "eu", "amount": 1}),
    ("wrong_type", "`amount` is STRING", {"order_id": "bad-2", "customer": "c1", "region": "eu", "amount": "12.5.0"}),
    ("out_of_range", "`amount`", {"order_id": "bad-3", "customer": "c1", "region": "eu", "amount": 1e30}),
    ("wrong_type", "`amount` is BOOLEAN", {"order_id": "bad-4", "customer": "c1", "region": "eu", "amount": True}),
    ("bad_event_time", "tomorrow", {"order_id": "bad-5", "customer": "c1", "region": "eu", "amount": 1,
                                    "ts": "tomorrow"}),
    ("event_time_out_of_range", "2199", {"order_id": "bad-6", "customer": "c1", "region": "eu", "amount": 1,
                                         "ts": "2199-01-01T00:00:00Z"}),
]


@dataclass(frozen=True)
class Order:
    order_id: str
    ts_ms: int
    customer: str
    region: str
    amount: Decimal
    note: str | None

    def body(self) -> str:
        """The JSON object without ID and time (a Pub/Sub message's data); `channel` is not in the schema."""
        fields = {"customer": self.customer, "region": self.region, "amount": "AMOUNT", "channel": "web"}
        if self.note is not None:
            fields["note"] = self.note
        # The amount as an exact JSON number, as a producer writes money, or every other order as a string holding
        # it, as BigQuery exports and Debezium write decimals: both are read exactly.
        amount = str(self.amount) if int(self.order_id[-1]) % 2 else f'"{self.amount}"'
        return json.dumps(fields).replace('"AMOUNT"', amount)

    def json_line(self) -> str:
        """The JSON-lines form, with `order_id` and `ts` in the object."""
        head = json.dumps({"order_id": self.order_id, "ts": self.ts_ms})
        return head[:-1] + ", " + self.body()[1:]

    @property
    def window_start(self) -> int:
        return self.ts_ms // WINDOW_MS * WINDOW_MS


def make_orders(base_ms: int, per_window: list[int], seed: int = 5, prefix: str = "o") -> list[Order]:
    """`per_window[w]` orders in the 5-minute window starting `base_ms + w * 5m`, over three regions."""
    rng = random.Random(seed)
    orders = []
    for w, count in enumerate(per_window):
        for i in range(count):
            orders.append(
                Order(
                    f"{prefix}{w}-{i:03d}",
                    base_ms + w * WINDOW_MS + rng.randrange(WINDOW_MS),
                    f"c{rng.randrange(5)}",
                    rng.choice(["eu", "us", "apac"]),
                    Decimal(rng.randrange(100, 100_000)) / 100,
                    None if i % 3 else f"note {i}",
                )
            )
    return orders


def bad_lines(ts_ms: int) -> list[str]:
    return [json.dumps({"ts": ts_ms, **fields}) for _, _, fields in BAD_ORDERS] + ["{not json"]


def region_sales(orders: list[Order]) -> list[tuple[int, str, int, Decimal, int]]:
    """(window start ms, region, orders, revenue, customers) of the first occurrence of every order id."""
    unique = {o.order_id: o for o in reversed(orders)}.values()
    groups: dict[tuple[int, str], list[Order]] = {}
    for order in unique:
        groups.setdefault((order.window_start, order.region), []).append(order)
    return sorted(
        (start, region, len(group), sum((o.amount for o in group), Decimal(0)), len({o.customer for o in group}))
        for (start, region), group in groups.items()
    )


def write_lines(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{line}\n" for line in lines))
