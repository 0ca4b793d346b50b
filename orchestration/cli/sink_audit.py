"""What the demo and the chaos harness check of `events`' record output `events_clean`, read independently of
onceflow's own bookkeeping: every record raw holds (read with delta-rs) is in each sink exactly once, counted by
the sink's own reader (psycopg; a `read_committed` Kafka consumer, by each record's `record_id` header), beside
`verify`'s batch-by-batch account (`onceflow.jobs.verify.record_outputs`)."""

from __future__ import annotations

from collections import Counter

from onceflow.jobs.declare.declaration import Pipeline
from onceflow.jobs.declare.kafka_sink import KafkaSink
from onceflow.jobs.declare.postgres_sink import PostgresSink
from onceflow.jobs.verify.record_outputs import RecordReconciliation
from onceflow.resources.delta_storage import delta_table
from onceflow.resources.kafka import KafkaClient
from onceflow.resources.kafka_writer import RECORD_ID_HEADER
from onceflow.resources.lake import LakeResource


def sink_ids(sink: object) -> Counter[str] | None:
    """How many times each record ID is in `sink`, by its own reader; None for a sink this cannot read."""
    if isinstance(sink, PostgresSink):
        import psycopg
        from psycopg import sql

        query = sql.SQL("SELECT record_id FROM {}").format(sql.Identifier(*sink.table.split(".")))
        dsn = sink.dsn.get_value() if hasattr(sink.dsn, "get_value") else sink.dsn
        with psycopg.connect(dsn) as connection:
            return Counter(r[0] for r in connection.execute(query))
    if isinstance(sink, KafkaSink):
        client = KafkaClient(sink.bootstrap_servers if isinstance(sink.bootstrap_servers, str)
                             else ",".join(sink.bootstrap_servers))
        partitions = client.partitions(sink.topic)
        first, last = (client.offsets(sink.topic, partitions, which) for which in ("earliest", "latest"))
        records = client.records(sink.topic, [(p, first[p], last[p]) for p in partitions])
        return Counter(dict(r.headers).get(RECORD_ID_HEADER, b"").decode() for r in records)
    return None


def audit_record_outputs(
    pipeline: Pipeline, lake: LakeResource, accounts: list[RecordReconciliation]
) -> dict[str, bool]:
    """Named checks: each record output's account holds, and every sink holds each raw record once."""
    raw = Counter(delta_table(lake.table_path(pipeline.raw_table)).to_pyarrow_table(columns=["record_id"])
                  .column("record_id").to_pylist())
    checks = {f"{a.asset}: {a.published} batches, {a.rows} rows, each in every sink (verify's account)": a.ok
              and not a.pending for a in accounts}
    for output in pipeline.record_outputs:
        for sink in output.sinks:
            held = sink_ids(sink)
            if held is not None:
                twice = sum(n - 1 for n in held.values() if n > 1)
                missing = len(set(raw) - set(held))
                checks[f"{output.asset} -> {sink.name}: every raw record once ({sum(held.values())} rows for "
                       f"{len(raw)} records; {missing} missing, {twice} twice)"] = held == raw
    return checks
