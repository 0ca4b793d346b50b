package io.onceflow;

import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import org.apache.hadoop.fs.Path;
import org.apache.spark.sql.catalyst.catalog.BucketSpec;
import org.apache.spark.sql.classic.Dataset;
import org.apache.spark.sql.classic.SparkSession;
import org.apache.spark.sql.execution.datasources.HadoopFsRelation;
import org.apache.spark.sql.execution.datasources.InMemoryFileIndex;
import org.apache.spark.sql.execution.datasources.LogicalRelation$;
import org.apache.spark.sql.execution.datasources.NoopCache$;
import org.apache.spark.sql.execution.datasources.PartitionSpec;
import org.apache.spark.sql.execution.datasources.text.TextFileFormat;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import scala.Option;
import scala.jdk.javaapi.CollectionConverters;

/**
 * {@code spark.read.option("lineSep", "\n").text(paths)} for a batch's files, without Spark's data-source lookup.
 *
 * <p>Reading files through {@code DataFrameReader} resolves the format's name by loading and instantiating every
 * data source the classpath registers, then checks the paths on a thread pool of its own: about 20 ms a batch on the
 * driver, while the executors wait. A batch's files are known and were just fingerprinted, so the relation that
 * resolution ends with is made directly: the same text format and options, over an index of exactly these files.
 */
public final class TextScan {
  private static final ObjectMapper JSON = new ObjectMapper();
  private final Dataset<?> lines;
  private final String[] uris;

  private TextScan(Dataset<?> lines, String[] uris) {
    this.lines = lines;
    this.uris = uris;
  }

  /**
   * The lines of the files at {@code pathsJson} (a JSON array of local paths or URIs; column {@code value}), and
   * Spark's URI of each file.
   */
  public static TextScan of(SparkSession session, String pathsJson) throws IOException {
    String[] paths = JSON.readValue(pathsJson, String[].class);
    Map<String, String> options = Map.of("lineSep", "\n");
    scala.collection.immutable.Map<String, String> scalaOptions =
        scala.collection.immutable.Map$.MODULE$.from(CollectionConverters.asScala(options));
    List<Path> files = Arrays.stream(paths).map(Path::new).toList();
    InMemoryFileIndex index = new InMemoryFileIndex(session, CollectionConverters.asScala(files).toList(),
        scalaOptions, Option.<StructType>empty(), NoopCache$.MODULE$, Option.<PartitionSpec>empty(),
        Option.empty());
    StructType schema = new StructType().add("value", DataTypes.StringType);
    HadoopFsRelation relation = new HadoopFsRelation(index, new StructType(), schema, Option.<BucketSpec>empty(),
        new TextFileFormat(), scalaOptions, session);
    return new TextScan(Dataset.ofRows(session, LogicalRelation$.MODULE$.apply(relation, false)), index.inputFiles());
  }

  public Dataset<?> lines() {
    return lines;
  }

  /** Spark's URI of each file the scan reads (as {@code _metadata.file_path} names it), in the order listed. */
  public String[] uris() {
    return uris;
  }
}
