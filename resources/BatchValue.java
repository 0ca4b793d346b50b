package io.onceflow;

import java.io.Serializable;
import java.util.List;
import java.util.Objects;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.codegen.CodeBlock;
import org.apache.spark.sql.catalyst.expressions.codegen.CodeGenerator;
import org.apache.spark.sql.catalyst.expressions.codegen.CodegenContext;
import org.apache.spark.sql.catalyst.expressions.codegen.ExprCode;
import org.apache.spark.sql.catalyst.expressions.codegen.JavaCode;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import scala.collection.immutable.IndexedSeq;
import scala.collection.immutable.Seq;
import scala.jdk.javaapi.CollectionConverters;

/**
 * {@code onceflow_batch_value('name', value)}: one of a batch's own values (its id, its time, its horizon floor, the
 * files it reads), the same on every row: a constant that is not NULL, of its type.
 *
 * <p>A literal would do, but Spark writes a BIGINT literal into the code it generates, so each batch's plan would be
 * compiled anew. This value reaches the generated code as a reference, as Spark passes a string literal: the code is
 * the same for every batch and compiled once. It is not foldable, so the optimizer never turns it into a literal.
 * It replaces a one-row table joined to the batch, whose broadcast cost a Spark job of its own for every batch.
 * {@code PlanTemplate} finds these by name to bind a plan to a batch's values ({@link #withValue}).
 */
public final class BatchValue extends Expression implements Serializable {
  private static final long serialVersionUID = 1L;
  private final String name;
  private final Object value;
  private final DataType type;

  public BatchValue(String name, Object value, DataType type) {
    this.name = name;
    this.value = value;
    this.type = type;
  }

  static Expression build(Seq<Expression> arguments) {
    List<Expression> args = CollectionConverters.asJava(arguments);
    if (args.size() != 2 || !args.get(0).foldable() || !args.get(0).dataType().equals(DataTypes.StringType)
        || !args.get(1).foldable()) {
      throw new IllegalArgumentException("onceflow_batch_value('name', value): a constant name and value");
    }
    Object value = args.get(1).eval(null);
    if (value == null) {
      throw new IllegalArgumentException("onceflow_batch_value('name', value): the value is NULL");
    }
    return new BatchValue(args.get(0).eval(null).toString(), value, args.get(1).dataType());
  }

  public String name() {
    return name;
  }

  /** This value of another batch: {@code newValue} is Spark's internal form of the type (a Long, an ArrayData). */
  public BatchValue withValue(Object newValue) {
    return new BatchValue(name, newValue, type);
  }

  @Override
  public Seq<Expression> children() {
    return CollectionConverters.asScala(List.<Expression>of()).toList();
  }

  @Override
  public boolean nullable() {
    return false;
  }

  @Override
  public DataType dataType() {
    return type;
  }

  @Override
  public Object eval(InternalRow input) {
    return value;
  }

  @Override
  public ExprCode doGenCode(CodegenContext ctx, ExprCode ev) {
    String reference = ctx.addReferenceObj("batchValue", value, CodeGenerator.boxedType(type));
    String code = "boolean " + ev.isNull() + " = false;\n" + CodeGenerator.javaType(type) + " " + ev.value() + " = "
        + reference + ";";
    return new ExprCode(new CodeBlock(CollectionConverters.asScala(List.of(code)).toList(),
        CollectionConverters.asScala(List.<JavaCode>of()).toList()), ev.isNull(), ev.value());
  }

  @Override
  public Expression withNewChildrenInternal(IndexedSeq<Expression> newChildren) {
    return this;
  }

  @Override
  public String prettyName() {
    return "onceflow_batch_value";
  }

  @Override
  public int productArity() {
    return 3;
  }

  @Override
  public Object productElement(int n) {
    return switch (n) {
      case 0 -> name;
      case 1 -> value;
      case 2 -> type;
      default -> throw new IndexOutOfBoundsException(Integer.toString(n));
    };
  }

  @Override
  public boolean canEqual(Object that) {
    return that instanceof BatchValue;
  }

  @Override
  public boolean equals(Object that) {
    return that instanceof BatchValue other && name.equals(other.name) && value.equals(other.value)
        && type.equals(other.type);
  }

  @Override
  public int hashCode() {
    return Objects.hash(name, value, type);
  }
}
