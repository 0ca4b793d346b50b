"""A user's pipeline whose declaration a test changes between two attempts of one batch, as a deploy does: loaded
with `ONCEFLOW_PIPELINES=tests.replay_pipelines`; its directory, schema and delivery come from `REPLAY_DIR`,
`REPLAY_SCHEMA` and `REPLAY_DELIVERY`."""

import os

from onceflow import FileSource, Pipeline

V1 = "customer STRING NOT NULL, amount DECIMAL(10,2) NOT NULL"
V2 = f"{V1}, note INT"
"""The next release of the declaration: a nullable field added, under which a record whose `note` is text (kept in
`payload` under V1) is a `wrong_type` dead letter."""

PIPELINES = [
    Pipeline(
        name="orders",
        source=FileSource(directory=os.environ.get("REPLAY_DIR", "/data/orders"), id_field="order_id",
                          timestamp_field="ts"),
        schema=os.environ.get("REPLAY_SCHEMA", V1),
        delivery=os.environ.get("REPLAY_DELIVERY", "exactly_once"),
    )
]
