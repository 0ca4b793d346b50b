package io.onceflow;

import java.io.Serializable;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.codegen.CodeBlock;
import org.apache.spark.sql.catalyst.expressions.codegen.CodeGenerator;
import org.apache.spark.sql.catalyst.expressions.codegen.CodegenContext;
import org.apache.spark.sql.catalyst.expressions.codegen.ExprCode;
import org.apache.spark.sql.catalyst.expressions.codegen.JavaCode;
import org.apache.spark.sql.classic.SparkSession;
import scala.Function1;
import scala.collection.immutable.IndexedSeq;
import scala.collection.immutable.Seq;
import scala.jdk.javaapi.CollectionConverters;

/**
 * A SQL function of one argument that Spark compiles into its stage's generated code, as it does its own: NULL
 * for a NULL argument, else {@link #call}'s value (which may be NULL). Registered in a classic session's own function
 * registry ({@link #register}): a UDF would convert every value to and from Java's types, and an expression that
 * Spark cannot compile ({@code CodegenFallback}) ends the stage before it and starts another after it, a copy of
 * every row each time.
 */
public abstract class CompiledFunction extends Expression implements Serializable {
  private static final long serialVersionUID = 1L;
  protected final Expression child;

  protected CompiledFunction(Expression child) {
    this.child = child;
  }

  /**
   * onceflow's compiled functions by name: {@code onceflow_batch_value} ({@link BatchValue}),
   * {@code onceflow_json_record}, {@code onceflow_utf8}, {@code onceflow_id_hash} ({@link IdHash}).
   */
  static Map<String, Function1<Seq<Expression>, Expression>> builders() {
    Map<String, Function1<Seq<Expression>, Expression>> builders = new LinkedHashMap<>();
    builders.put("onceflow_batch_value", BatchValue::build);
    builders.put("onceflow_json_record", JsonRecord::build);
    builders.put("onceflow_utf8", Utf8Text::build);
    builders.put("onceflow_id_hash", IdHash::build);
    return builders;
  }

  /** Register onceflow's compiled functions ({@link #builders}) in the classic {@code session}. */
  public static void register(SparkSession session) {
    builders().forEach((name, builder) ->
        session.sessionState().functionRegistry().createOrReplaceTempFunction(name, builder, "java_udf"));
  }

  /** The value for a non-NULL {@code argument}, or null. */
  protected abstract Object call(Object argument);

  /** Java source computing {@link #call} of the Java value {@code argument} (registering what it needs in ctx). */
  protected abstract String callCode(CodegenContext ctx, String argument);

  /** This function of {@code newChild}. */
  protected abstract CompiledFunction withChild(Expression newChild);

  /** What else than its argument makes this function what it is (equal settings, equal functions). */
  protected abstract List<Object> settings();

  @Override
  public Seq<Expression> children() {
    return CollectionConverters.asScala(List.of(child)).toList();
  }

  @Override
  public boolean nullable() {
    return true;
  }

  @Override
  public Object eval(InternalRow input) {
    Object argument = child.eval(input);
    return argument == null ? null : call(argument);
  }

  @Override
  public ExprCode doGenCode(CodegenContext ctx, ExprCode ev) {
    ExprCode argument = child.genCode(ctx);
    // A primitive value (a BIGINT) is never NULL for an argument that is not.
    boolean primitive = CodeGenerator.isPrimitiveType(dataType());
    String code = argument.code() + "\nboolean " + ev.isNull() + " = " + argument.isNull() + ";\n"
        + CodeGenerator.javaType(dataType()) + " " + ev.value() + " = "
        + (primitive ? CodeGenerator.defaultValue(dataType(), false) : "null") + ";\nif (!" + ev.isNull() + ") {\n  "
        + ev.value() + " = " + callCode(ctx, argument.value().toString()) + ";\n"
        + (primitive ? "" : "  " + ev.isNull() + " = " + ev.value() + " == null;\n") + "}";
    return new ExprCode(new CodeBlock(CollectionConverters.asScala(List.of(code)).toList(),
        CollectionConverters.asScala(List.<JavaCode>of()).toList()), ev.isNull(), ev.value());
  }

  @Override
  public Expression withNewChildrenInternal(IndexedSeq<Expression> newChildren) {
    return withChild(newChildren.apply(0));
  }

  @Override
  public int productArity() {
    return 1;
  }

  @Override
  public Object productElement(int n) {
    if (n != 0) {
      throw new IndexOutOfBoundsException(Integer.toString(n));
    }
    return child;
  }

  @Override
  public boolean canEqual(Object that) {
    return that != null && that.getClass() == getClass();
  }

  @Override
  public boolean equals(Object that) {
    return canEqual(that) && child.equals(((CompiledFunction) that).child)
        && settings().equals(((CompiledFunction) that).settings());
  }

  @Override
  public int hashCode() {
    return Objects.hash(getClass(), child, settings());
  }
}
