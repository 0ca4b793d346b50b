package io.onceflow;

import com.fasterxml.jackson.databind.ObjectMapper;
import java.util.ArrayList;
import java.util.List;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.Attribute;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.MutableProjection;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.catalyst.plans.logical.Project;
import org.apache.spark.sql.classic.Dataset;
import org.apache.spark.sql.classic.SparkSession;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.unsafe.types.UTF8String;
import scala.jdk.javaapi.CollectionConverters;

/**
 * A DataFrame's projection, analyzed and optimized once, then evaluated on the driver over a few rows at a time
 * without a Spark job: Spark's own interpreted evaluation of the very expressions its job would run (its
 * optimizer does the same to a projection over rows it holds, `ConvertToLocalRelation`).
 *
 * <p>The template is a projection over a leaf of STRING, TIMESTAMP and BIGINT columns; rows come in and go out
 * as JSON arrays, a column each (a TIMESTAMP as microseconds since the epoch), so one call crosses Py4J once.
 */
public final class LocalProjection {
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final int PART = 3000;
  private final SparkSession session;
  private final MutableProjection projection;
  private final DataType[] inputTypes;
  private final DataType[] outputTypes;

  public LocalProjection(Dataset<?> template) {
    LogicalPlan plan = template.queryExecution().optimizedPlan();
    if (!(plan instanceof Project)) {
      throw new IllegalArgumentException("not a projection over its input: " + plan.getClass().getSimpleName());
    }
    Project project = (Project) plan;
    List<Attribute> input = CollectionConverters.asJava(project.child().output());
    session = template.sparkSession();
    projection = MutableProjection.create((scala.collection.immutable.Seq) project.projectList(),
        project.child().output());
    projection.initialize(0);
    inputTypes = input.stream().map(Attribute::dataType).toArray(DataType[]::new);
    outputTypes = CollectionConverters.asJava(project.output()).stream().map(Attribute::dataType)
        .toArray(DataType[]::new);
    for (DataType[] types : new DataType[][] {inputTypes, outputTypes}) {
      for (DataType type : types) {
        if (!type.equals(DataTypes.StringType) && !type.equals(DataTypes.TimestampType)
            && !type.equals(DataTypes.LongType)) {
          throw new IllegalArgumentException("a column of type " + type.simpleString());
        }
      }
    }
  }

  /**
   * The projection of `columnsJson` (the input's columns, a JSON array of each), as the output's columns, in parts
   * small enough for one Py4J reply each: a reply over Py4J's 8 KiB buffer goes out in two writes, and the second
   * waits for the first's delayed acknowledgement (40 ms) wherever Nagle's algorithm is still on (`Py4JNoDelay`
   * cannot turn it off on a JDK that hides a thread's connection).
   */
  public synchronized String[] apply(String columnsJson) throws Exception {
    // The session's settings (its time zone, ANSI mode) govern evaluation on this thread as in its jobs.
    SparkSession.setActiveSession(session);
    List<List<Object>> columns = JSON.readValue(columnsJson, List.class);
    int rows = columns.isEmpty() ? 0 : columns.get(0).size();
    List<List<Object>> out = new ArrayList<>();
    for (int j = 0; j < outputTypes.length; j++) {
      out.add(new ArrayList<>(rows));
    }
    Object[] values = new Object[inputTypes.length];
    for (int i = 0; i < rows; i++) {
      for (int j = 0; j < inputTypes.length; j++) {
        values[j] = internal(inputTypes[j], columns.get(j).get(i));
      }
      InternalRow row = projection.apply(new GenericInternalRow(values));
      for (int j = 0; j < outputTypes.length; j++) {
        out.get(j).add(row.isNullAt(j) ? null
            : outputTypes[j].equals(DataTypes.StringType) ? row.getUTF8String(j).toString() : row.getLong(j));
      }
    }
    String text = JSON.writeValueAsString(out);
    // Py4J escapes some characters of a reply, so a part of 3,000 characters stays under its buffer.
    String[] parts = new String[(text.length() + PART - 1) / PART];
    for (int i = 0; i < parts.length; i++) {
      parts[i] = text.substring(i * PART, Math.min(text.length(), (i + 1) * PART));
    }
    return parts;
  }

  private static Object internal(DataType type, Object value) {
    if (value == null) {
      return null;
    }
    return type.equals(DataTypes.StringType) ? UTF8String.fromString((String) value) : ((Number) value).longValue();
  }
}
