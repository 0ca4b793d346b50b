package io.onceflow;

import com.fasterxml.jackson.databind.ObjectMapper;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import org.apache.spark.api.java.JavaRDD;
import org.apache.spark.api.java.JavaSparkContext;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.Attribute;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.MutableProjection;
import org.apache.spark.sql.catalyst.plans.logical.LocalRelation;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.catalyst.plans.logical.Project;
import org.apache.spark.sql.classic.Dataset;
import org.apache.spark.sql.classic.SparkSession;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.unsafe.types.UTF8String;
import scala.Option;
import scala.collection.immutable.Seq;
import scala.jdk.javaapi.CollectionConverters;

/**
 * A DataFrame's projection, analyzed and optimized once, then evaluated on the driver over a few rows at a time
 * without a Spark job: Spark's own interpreted evaluation of the very expressions its job would run (its
 * optimizer does the same to a projection over rows it holds, `ConvertToLocalRelation`).
 *
 * <p>Over Py4J ({@link #apply}), the template is a projection over a leaf of STRING, TIMESTAMP and BIGINT columns;
 * rows come in and go out as JSON arrays, a column each (a TIMESTAMP as microseconds since the epoch), so one call
 * crosses Py4J once. On a Spark Connect server ({@link #relation}, {@link ProjectionPlugin}) they are Spark's rows.
 */
public final class LocalProjection {
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final int PART = 3000;
  private final SparkSession session;
  private final MutableProjection projection;
  private final DataType[] inputTypes;
  private final DataType[] outputTypes;
  private final List<Attribute> output;
  private final boolean textual;

  /**
   * The projection {@code template} makes of the rows of its one leaf, whatever that leaf is: analysed as it is, and
   * optimized over rows Spark cannot see (an empty RDD), where the optimizer keeps the projection (over an empty
   * local relation it would evaluate it to nothing).
   */
  public static LocalProjection over(Dataset<?> template) {
    SparkSession session = template.sparkSession();
    List<LogicalPlan> leaves = CollectionConverters.asJava(template.queryExecution().analyzed().collectLeaves());
    if (leaves.size() != 1) {
      throw new IllegalArgumentException("a projection over " + leaves.size() + " leaves, not one");
    }
    Dataset<?> placeholder = Dataset.ofRows(session, leaves.get(0));
    JavaRDD<Row> nothing = JavaSparkContext.fromSparkContext(session.sparkContext()).emptyRDD();
    try {
      return new LocalProjection(new PlanTemplate(template, placeholder, "")
          .bind(session.createDataFrame(nothing, placeholder.schema()), "{}"));
    } catch (java.io.IOException impossible) {
      throw new IllegalStateException(impossible);
    }
  }

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
    output = CollectionConverters.asJava(project.output());
    outputTypes = output.stream().map(Attribute::dataType).toArray(DataType[]::new);
    textual = java.util.stream.Stream.concat(Arrays.stream(inputTypes), Arrays.stream(outputTypes)).allMatch(
        type -> type.equals(DataTypes.StringType) || type.equals(DataTypes.TimestampType)
            || type.equals(DataTypes.LongType));
  }

  /** The projection of {@code rows} (the input's columns, in order), as rows held on the driver. */
  public synchronized LocalRelation relation(Seq<InternalRow> rows) {
    SparkSession.setActiveSession(session);
    List<InternalRow> out = new ArrayList<>(rows.size());
    CollectionConverters.asJava(rows).forEach(row -> out.add(projection.apply(row).copy()));
    List<Attribute> attributes = new ArrayList<>();
    output.forEach(attribute -> attributes.add(attribute.newInstance()));
    return new LocalRelation(CollectionConverters.asScala(attributes).toList(),
        CollectionConverters.asScala(out).toList(), false, Option.empty());
  }

  /**
   * The projection of `columnsJson` (the input's columns, a JSON array of each), as the output's columns, in parts
   * small enough for one Py4J reply each: a reply over Py4J's 8 KiB buffer goes out in two writes, and the second
   * waits for the first's delayed acknowledgement (40 ms) wherever Nagle's algorithm is still on (`Py4JNoDelay`
   * cannot turn it off on a JDK that hides a thread's connection).
   */
  public synchronized String[] apply(String columnsJson) throws Exception {
    if (!textual) {
      throw new IllegalArgumentException("columns as JSON need STRING, TIMESTAMP and BIGINT columns only");
    }
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
