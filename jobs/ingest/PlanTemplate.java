package io.onceflow;

import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.Alias;
import org.apache.spark.sql.catalyst.expressions.Attribute;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.NamedExpression;
import org.apache.spark.sql.catalyst.plans.logical.LocalRelation;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.catalyst.plans.logical.Project;
import org.apache.spark.sql.classic.Dataset;
import org.apache.spark.sql.types.Metadata;
import scala.Option;
import scala.collection.immutable.Seq;
import scala.jdk.javaapi.CollectionConverters;

/**
 * A batch's plan analysed once: a DataFrame built over a placeholder for the batch's landed rows and a one-row
 * table of its numbers, bound to each batch's own landed rows and numbers without analysing it again.
 *
 * <p>Structured Streaming does the same with each micro-batch: its query is analysed once, and each batch's plan is
 * that plan with its sources' leaves replaced. Binding puts, where the placeholder was, a projection of the batch's
 * landed rows that gives each column the placeholder's attribute (same name, same expression id), so every
 * expression above reads them unchanged; and, where the numbers' table was, a one-row table of this batch's
 * numbers with the same attributes. Every part of the bound plan was analysed (the template, the landed rows) or
 * is made of resolved attributes (the projection, the table), so it is marked analysed as it is: the analysis that
 * cost a realistic batch a tenth of a second is not run again. The optimizer and the planner still run per batch.
 */
public final class PlanTemplate {
  private final LogicalPlan template;
  private final List<Attribute> placeholder;
  private final List<String> names;

  /**
   * {@code template}, built over the DataFrame {@code placeholder} and a one-row table of numbers with the columns
   * {@code names} (in order; each a BIGINT).
   */
  public PlanTemplate(Dataset<?> template, Dataset<?> placeholder, String names) {
    this.template = template.queryExecution().analyzed();
    this.placeholder = CollectionConverters.asJava(placeholder.queryExecution().analyzed().output());
    this.names = Arrays.asList(names.split(","));
    // A leaf that binding would not find would keep the template's values for every batch, silently.
    if (leaves(this.template, this.placeholder::equals) != 1) {
      throw new IllegalArgumentException("the template does not read its placeholder once");
    }
    if (leaves(this.template, output -> output.stream().map(Attribute::name).toList().equals(this.names)) != 1) {
      throw new IllegalArgumentException("the template does not read one table of the numbers " + this.names);
    }
  }

  /** The template over {@code landed} (the placeholder's columns, of its types) and {@code numbers} (comma-separated). */
  public Dataset<?> bind(Dataset<?> landed, String numbers) {
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
    Object[] values = Arrays.stream(numbers.split(",")).map(Long::parseLong).toArray();
    if (values.length != names.size()) {
      throw new IllegalArgumentException(values.length + " numbers for " + names);
    }
    LogicalPlan bound = replace(template, input, new GenericInternalRow(values));
    bound.setAnalyzed();
    return Dataset.ofRows(landed.sparkSession(), bound);
  }

  private LogicalPlan replace(LogicalPlan node, LogicalPlan input, InternalRow numbers) {
    if (node.children().isEmpty()) {
      List<Attribute> output = CollectionConverters.asJava(node.output());
      if (output.equals(placeholder)) {
        return input;
      }
      if (output.stream().map(Attribute::name).toList().equals(names)) {
        return new LocalRelation(node.output(), seq(List.of(numbers)), false, Option.empty());
      }
      return node;
    }
    List<LogicalPlan> children = CollectionConverters.asJava(node.children());
    List<LogicalPlan> replaced = new ArrayList<>();
    boolean changed = false;
    for (LogicalPlan child : children) {
      LogicalPlan next = replace(child, input, numbers);
      changed |= next != child;
      replaced.add(next);
    }
    return changed ? node.withNewChildren(seq(replaced)) : node;
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
