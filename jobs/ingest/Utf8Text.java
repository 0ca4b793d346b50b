package io.onceflow;

import java.util.List;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.codegen.CodegenContext;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.unsafe.types.UTF8String;
import scala.collection.immutable.Seq;
import scala.jdk.javaapi.CollectionConverters;

/**
 * {@code onceflow_utf8(bytes)}: Spark's {@code try_validate_utf8(CAST(bytes AS STRING))}, the bytes as text when
 * they are valid UTF-8 (Spark's {@code UTF8String.isValid}), else NULL. Text that is all ASCII, as most records
 * are, is valid without the byte-by-byte decoding {@code isValid} does: a tenth of a batch of flights.
 */
public final class Utf8Text extends CompiledFunction {
  private static final long serialVersionUID = 1L;

  private Utf8Text(Expression child) {
    super(child);
  }

  static Expression build(Seq<Expression> arguments) {
    List<Expression> args = CollectionConverters.asJava(arguments);
    if (args.size() != 1 || !args.get(0).dataType().equals(DataTypes.BinaryType)) {
      throw new IllegalArgumentException("onceflow_utf8(bytes): one BINARY argument");
    }
    return new Utf8Text(args.get(0));
  }

  /** {@code bytes} as text if they are valid UTF-8, else null. */
  public static UTF8String valid(byte[] bytes) {
    UTF8String text = UTF8String.fromBytes(bytes);
    return ascii(bytes) || text.isValid() ? text : null;
  }

  private static boolean ascii(byte[] bytes) {
    int high = 0;
    for (byte b : bytes) {
      high |= b;
    }
    return high >= 0;
  }

  @Override
  protected Object call(Object argument) {
    return valid((byte[]) argument);
  }

  @Override
  protected String callCode(CodegenContext ctx, String argument) {
    return Utf8Text.class.getName() + ".valid(" + argument + ")";
  }

  @Override
  protected CompiledFunction withChild(Expression newChild) {
    return new Utf8Text(newChild);
  }

  @Override
  protected List<Object> settings() {
    return List.of();
  }

  @Override
  public DataType dataType() {
    return DataTypes.StringType;
  }

  @Override
  public String prettyName() {
    return "onceflow_utf8";
  }
}
