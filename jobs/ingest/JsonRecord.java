package io.onceflow;

import java.util.HashMap;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.ExprUtils;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.codegen.CodegenContext;
import org.apache.spark.sql.catalyst.json.CreateJacksonParser;
import org.apache.spark.sql.catalyst.json.JSONOptions;
import org.apache.spark.sql.catalyst.json.JacksonParser;
import org.apache.spark.sql.catalyst.util.ArrayData;
import org.apache.spark.sql.catalyst.util.FailureSafeParser;
import org.apache.spark.sql.catalyst.util.MapData;
import org.apache.spark.sql.internal.SQLConf;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;
import scala.Function1;
import scala.collection.Iterator;
import scala.collection.immutable.Seq;
import scala.jdk.javaapi.CollectionConverters;

/**
 * {@code onceflow_json_record(json, 'ddl', map(options))}: Spark's {@code from_json(json, 'ddl', map(options))} of a
 * STRUCT, by Spark's own parser with the same options, schema and failure handling (its {@code JacksonParser} in
 * a {@code FailureSafeParser}, as {@code JsonToStructsEvaluator} builds them), differing in two ways that change
 * no result:
 *
 * <ul>
 *   <li>It is compiled into its stage's generated code. {@code from_json} is not ({@code CodegenFallback}): a
 *       stage ends before it and another begins after it, and each row of the batch was copied twice more.
 *   <li>Jackson reads the record's text from a {@code String}, where {@code from_json} wraps its bytes in an
 *       {@code InputStreamReader}, whose decoder allocates an 8 KiB buffer for each record. Both hand Jackson's
 *       character-based parser the same characters: never its byte-based one, which guesses the encoding.
 * </ul>
 *
 * <p>Registered by {@link CompiledFunction#register}; the expression is built at analysis, with the session's time
 * zone, as {@code from_json}'s is.
 */
public final class JsonRecord extends CompiledFunction {
  private static final long serialVersionUID = 1L;
  private final StructType schema;
  private final HashMap<String, String> options;
  private final String timeZone;
  private final String corruptDefault;
  private transient FailureSafeParser<UTF8String> parser;

  JsonRecord(Expression child, StructType schema, HashMap<String, String> options, String timeZone,
      String corruptDefault) {
    super(child);
    this.schema = schema;
    this.options = options;
    this.timeZone = timeZone;
    this.corruptDefault = corruptDefault;
  }

  static Expression build(Seq<Expression> arguments) {
    java.util.List<Expression> args = CollectionConverters.asJava(arguments);
    if (args.size() != 3 || !args.get(1).foldable() || !args.get(2).foldable()) {
      throw new IllegalArgumentException(
          "onceflow_json_record(json, 'ddl', map(options)): constant schema and options");
    }
    StructType schema = (StructType) StructType.fromDDL(args.get(1).eval(null).toString()).asNullable();
    MapData map = (MapData) args.get(2).eval(null);
    ArrayData keys = map.keyArray();
    ArrayData values = map.valueArray();
    HashMap<String, String> options = new HashMap<>();
    for (int i = 0; i < map.numElements(); i++) {
      options.put(keys.getUTF8String(i).toString(), values.getUTF8String(i).toString());
    }
    SQLConf conf = SQLConf.get();
    return new JsonRecord(args.get(0), schema, options, conf.sessionLocalTimeZone(),
        conf.columnNameOfCorruptRecord());
  }

  /** The record {@code json} as a row of the schema; a record Spark cannot read as in {@code from_json}. */
  public InternalRow parse(UTF8String json) {
    if (parser == null) {
      parser = parser();
    }
    Iterator<InternalRow> rows = parser.parse(json);
    return rows.hasNext() ? rows.next() : null;
  }

  private FailureSafeParser<UTF8String> parser() {
    JSONOptions parsed = new JSONOptions(
        scala.collection.immutable.Map$.MODULE$.from(CollectionConverters.asScala(options)), timeZone, corruptDefault);
    String corrupt = parsed.columnNameOfCorruptRecord();
    ExprUtils.verifyColumnNameOfCorruptRecord(schema, corrupt);
    StructType actual = new StructType(java.util.Arrays.stream(schema.fields())
        .filter(f -> !f.name().equals(corrupt)).toArray(StructField[]::new));
    JacksonParser raw = new JacksonParser(actual, parsed, false, CollectionConverters.asScala(
        java.util.List.<org.apache.spark.sql.sources.Filter>of()).toList());
    Function1<UTF8String, scala.collection.Iterable<InternalRow>> read = record -> raw.parse(record,
        (factory, text) -> CreateJacksonParser.string(factory, text.toString()), text -> text);
    return new FailureSafeParser<>(read, parsed.parseMode(), schema, corrupt);
  }

  @Override
  protected Object call(Object argument) {
    return parse((UTF8String) argument);
  }

  @Override
  protected String callCode(CodegenContext ctx, String argument) {
    return ctx.addReferenceObj("jsonRecord", this, JsonRecord.class.getName()) + ".parse(" + argument + ")";
  }

  @Override
  protected CompiledFunction withChild(Expression newChild) {
    return new JsonRecord(newChild, schema, options, timeZone, corruptDefault);
  }

  @Override
  protected java.util.List<Object> settings() {
    return java.util.List.of(schema, options, timeZone, corruptDefault);
  }

  @Override
  public DataType dataType() {
    return schema;
  }

  @Override
  public String prettyName() {
    return "onceflow_json_record";
  }
}
