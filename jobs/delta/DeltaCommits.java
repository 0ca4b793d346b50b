package io.onceflow;

import java.io.IOException;
import java.io.UncheckedIOException;

import org.apache.hadoop.fs.Path;
import org.apache.spark.SparkEnv;
import org.apache.spark.deploy.SparkHadoopUtil;

/**
 * Whether a Delta table's log holds a commit of a given version, asked from inside a Spark query.
 *
 * <p>Called through Spark's {@code reflect} from the source of an append's MERGE (see {@code delta_txn}), so it
 * runs after the MERGE's transaction has taken its snapshot of the table: the answer covers every commit that
 * snapshot can hold. Works wherever it runs (driver or executor), with the engine's Hadoop settings.
 */
public final class DeltaCommits {
  private DeltaCommits() {}

  /** Whether the table at {@code table} has a commit numbered {@code version}. */
  public static boolean exists(String table, long version) {
    Path commit = new Path(table + "/_delta_log/" + String.format("%020d.json", version));
    try {
      return commit.getFileSystem(SparkHadoopUtil.get().newConfiguration(SparkEnv.get().conf())).exists(commit);
    } catch (IOException error) {
      throw new UncheckedIOException(error);
    }
  }
}
