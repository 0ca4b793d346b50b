package io.onceflow;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.util.HexFormat;
import java.util.TreeMap;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import org.apache.spark.sql.catalyst.expressions.Alias;
import org.apache.spark.sql.catalyst.expressions.Attribute;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.NamedExpression;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.catalyst.plans.logical.Project;
import org.apache.spark.sql.classic.Dataset;
import org.apache.spark.sql.classic.SparkSession;
import org.apache.spark.sql.catalyst.util.GenericArrayData;
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.Metadata;
import org.apache.spark.unsafe.types.UTF8String;
import scala.Option;
import scala.runtime.AbstractPartialFunction;
import scala.collection.immutable.Seq;
import scala.jdk.javaapi.CollectionConverters;

/**
 * A batch's plan analysed once: a DataFrame built over a placeholder for the batch's rows and holding its values
 * as {@link BatchValue}s, bound to each batch's own rows and values without analysing it again.
 *
 * <p>Structured Streaming does the same with each micro-batch: its query is analysed once, and each batch's plan is
 * that plan with its sources' leaves replaced. Binding puts, where the placeholder was, a projection of the batch's
 * landed rows that gives each column the placeholder's attribute (same name, same expression id), so every
 * expression above reads them unchanged; and gives each {@code BatchValue} this batch's value of its name. Every
 * part of the bound plan was analysed (the template, the landed rows) or is made of resolved attributes (the
 * projection), so it is marked analysed as it is: the analysis that cost a realistic batch a tenth of a second is
 * not run again. The optimizer and the planner still run per batch.
 */
public final class PlanTemplate {
  private static final ObjectMapper JSON = new ObjectMapper();
  private final LogicalPlan template;
  private final List<Attribute> placeholder;
  private final List<String> names;

  /**
   * A digest of the session's settings: a template was analysed (and a projection optimized) under the settings it
   * was built with (some expressions read one then, such as `spark.sql.json.enablePartialResults`), so other
   * settings need another.
   * A digest, not the settings: a Py4J reply over 8 KiB waits 40 ms (see `apply`).
   */
  public static String settings(SparkSession session) {
    String text = new TreeMap<>(CollectionConverters.asJava(session.conf().getAll())).toString();
    return digest(text.getBytes(StandardCharsets.UTF_8));
  }

  /** The SHA-256 of {@code bytes}, in hex. */
  public static String digest(byte[] bytes) {
    try {
      return HexFormat.of().formatHex(MessageDigest.getInstance("SHA-256").digest(bytes));
    } catch (java.security.NoSuchAlgorithmException impossible) {  // every JVM has SHA-256
      throw new IllegalStateException(impossible);
    }
  }

  /**
   * {@code template}, built over the DataFrame {@code placeholder} and holding a {@link BatchValue} of each of the
   * values {@code names} (comma-separated; empty for none).
   */
  public PlanTemplate(Dataset<?> template, Dataset<?> placeholder, String names) {
    this.template = template.queryExecution().analyzed();
    this.placeholder = CollectionConverters.asJava(placeholder.queryExecution().analyzed().output());
    this.names = names.isEmpty() ? List.of() : Arrays.asList(names.split(","));
    // A placeholder or a number that binding would not find would keep the template's for every batch, silently.
    if (leaves(this.template, this.placeholder::equals) != 1) {
      throw new IllegalArgumentException("the template does not read its placeholder once");
    }
    Set<String> held = new HashSet<>();
    valueNames(this.template, held);
    if (!held.equals(new HashSet<>(this.names))) {
      throw new IllegalArgumentException("the template holds the values " + held + ", not " + this.names);
    }
  }

  /**
   * The template over {@code landed} (the placeholder's columns, of its types) and {@code values}: a JSON object of
   * every name's value, a number for a BIGINT, a list of texts for an ARRAY&lt;STRING&gt;.
   */
  public Dataset<?> bind(Dataset<?> landed, String values) throws IOException {
    List<Attribute> columns = CollectionConverters.asJava(landed.queryExecution().analyzed().output());
    if (columns.size() != placeholder.size()) {
      throw new IllegalArgumentException("landed rows of " + columns.size() + " columns for a template of "
          + placeholder.size());
    }
    List<NamedExpression> renamed = new ArrayList<>();
    for (int i = 0; i < columns.size(); i++) {
      Attribute column = columns.get(i);
      Attribute target = placeholder.get(i);
      if (!column.dataType().equals(target.dataType())) {
        throw new IllegalArgumentException("landed column " + column.name() + " is " + column.dataType().simpleString()
            + ", the template's " + target.name() + " is " + target.dataType().simpleString());
      }
      renamed.add(new Alias(column, target.name(), target.exprId(), seq(List.of()), Option.<Metadata>empty(),
          seq(List.of())));
    }
    LogicalPlan input = new Project(seq(renamed), landed.queryExecution().analyzed());
    JsonNode byName = JSON.readTree(values);
    Set<String> given = new HashSet<>();
    byName.fieldNames().forEachRemaining(given::add);
    if (!given.equals(new HashSet<>(names))) {
      throw new IllegalArgumentException("values of " + values + " for the template's " + names);
    }
    // The batch's values go into the template before its rows do: the rows' plan may hold values of its own.
    LogicalPlan valued = template.transformAllExpressions(new AbstractPartialFunction<>() {
      @Override
      public boolean isDefinedAt(Expression e) {
        return e instanceof BatchValue;
      }

      @Override
      public Expression apply(Expression e) {
        BatchValue value = (BatchValue) e;
        return value.withValue(internal(value, byName.get(value.name())));
      }
    });
    LogicalPlan bound = replace(valued, input);
    bound.setAnalyzed();
    return Dataset.ofRows(landed.sparkSession(), bound);
  }

  /** {@code json} as Spark's internal value of {@code value}'s type. */
  private static Object internal(BatchValue value, JsonNode json) {
    if (value.dataType().equals(DataTypes.LongType) && json.canConvertToLong()) {
      return json.longValue();
    }
    if (value.dataType() instanceof ArrayType array && array.elementType().equals(DataTypes.StringType)
        && json.isArray()) {
      List<UTF8String> texts = new ArrayList<>();
      json.forEach(text -> texts.add(UTF8String.fromString(text.textValue())));
      return new GenericArrayData(texts.toArray());
    }
    throw new IllegalArgumentException(value.name() + " is a " + value.dataType().simpleString() + ", not " + json);
  }

  private LogicalPlan replace(LogicalPlan node, LogicalPlan input) {
    if (node.children().isEmpty()) {
      return CollectionConverters.asJava(node.output()).equals(placeholder) ? input : node;
    }
    List<LogicalPlan> children = CollectionConverters.asJava(node.children());
    List<LogicalPlan> replaced = new ArrayList<>();
    boolean changed = false;
    for (LogicalPlan child : children) {
      LogicalPlan next = replace(child, input);
      changed |= next != child;
      replaced.add(next);
    }
    return changed ? node.withNewChildren(seq(replaced)) : node;
  }

  private static void valueNames(LogicalPlan node, Set<String> held) {
    CollectionConverters.asJava(node.expressions()).forEach(e -> valueNames(e, held));
    CollectionConverters.asJava(node.children()).forEach(child -> valueNames(child, held));
  }

  private static void valueNames(Expression expression, Set<String> held) {
    if (expression instanceof BatchValue number) {
      held.add(number.name());
    }
    CollectionConverters.asJava(expression.children()).forEach(child -> valueNames(child, held));
  }

  private static int leaves(LogicalPlan node, java.util.function.Predicate<List<Attribute>> wanted) {
    if (node.children().isEmpty()) {
      return wanted.test(CollectionConverters.asJava(node.output())) ? 1 : 0;
    }
    return CollectionConverters.asJava(node.children()).stream().mapToInt(child -> leaves(child, wanted)).sum();
  }

  private static <T> Seq<T> seq(List<T> items) {
    return CollectionConverters.asScala(items).toList();
  }
}
