"""How each engine reaches a `gs://` home: Spark through Hadoop's GCS connector (`fs.gs.*` settings), delta-rs
through Rust's `object_store` (its storage options), the object stores through Google's client.

All of them honour the standard `STORAGE_EMULATOR_HOST`: set, every client talks plain HTTP to that emulator
without credentials; unset, they use Google's Application Default Credentials (the environment, the gcloud
login or the machine's service account), which onceflow never reads, copies or logs.
"""

from __future__ import annotations

import json

from onceflow.resources.settings import load_settings

MIB = 1 << 20
# Hadoop's defaults for these keys are sizes like "64m", which the connector reads as plain numbers (and fails):
# each is given as a byte count, with Hadoop's default value.
SIZE_CONF = {
    "fs.gs.block.size": 64 * MIB,
    "fs.gs.rewrite.max.chunk.size": 512 * MIB,
    "fs.gs.outputstream.buffer.size": 8 * MIB,
    "fs.gs.inputstream.inplace.seek.limit": 8 * MIB,
    "fs.gs.inputstream.min.range.request.size": 2 * MIB,
}


def is_gcs(uri: str) -> bool:
    return uri.startswith("gs://")


def hadoop_gcs_conf(emulator_host: str | None) -> dict[str, str]:
    """The Hadoop `fs.gs.*` settings of a Spark session (without the `spark.hadoop.` prefix)."""
    conf = {
        # Hadoop 3.5 names a GCS file system of its own that pyspark does not ship: name the connector's.
        "fs.gs.impl": "com.google.cloud.hadoop.fs.gcs.GoogleHadoopFileSystem",
        "fs.AbstractFileSystem.gs.impl": "com.google.cloud.hadoop.fs.gcs.GoogleHadoopFS",
        **{key: str(value) for key, value in SIZE_CONF.items()},
    }
    if emulator_host is None:
        return {**conf, "fs.gs.auth.type": "APPLICATION_DEFAULT"}
    return {
        **conf,
        "fs.gs.storage.root.url": emulator_host.rstrip("/"),
        "fs.gs.auth.type": "UNAUTHENTICATED",
        # The emulator has no atomic move; on real GCS the connector's move is the right rename.
        "fs.gs.operation.move.enable": "false",
    }


def spark_gcs_conf() -> dict[str, str]:
    """`hadoop_gcs_conf` for this process's settings, as Spark settings (`spark.hadoop.fs.gs.*`)."""
    host = load_settings().storage_emulator_host
    return {f"spark.hadoop.{key}": value for key, value in hadoop_gcs_conf(host).items()}


def delta_rs_gcs_options(emulator_host: str | None) -> dict[str, str] | None:
    """delta-rs's storage options for a `gs://` table: None on real GCS (`object_store` finds Application Default
    Credentials itself); on an emulator, its URL with OAuth turned off."""
    if emulator_host is None:
        return None
    # object_store takes an emulator's URL only from a service-account key: this one carries no secret.
    key = {"gcs_base_url": emulator_host.rstrip("/"), "disable_oauth": True, "client_email": "", "private_key": "",
           "private_key_id": ""}
    return {"google_service_account_key": json.dumps(key), "allow_http": "true"}
