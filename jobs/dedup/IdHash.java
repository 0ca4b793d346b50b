package io.onceflow;

import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.util.List;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.codegen.CodegenContext;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.unsafe.Platform;
import org.apache.spark.unsafe.types.UTF8String;
import scala.collection.immutable.Seq;
import scala.jdk.javaapi.CollectionConverters;

/**
 * {@code onceflow_id_hash(id, 'key of 16 bytes')}: half of a record ID's fingerprint, bit for bit what the driver
 * computes ({@code pandas.util.hash_array(ids, hash_key=key, categorize=False)}, as a BIGINT): SipHash-2-4 of the
 * ID's UTF-8 bytes under the key, then pandas' final mixing. A batch's IDs are hashed in its Spark stage, on every
 * core, instead of on the driver after it.
 */
public final class IdHash extends CompiledFunction {
  private static final long serialVersionUID = 1L;
  private static final boolean LITTLE_ENDIAN = ByteOrder.nativeOrder() == ByteOrder.LITTLE_ENDIAN;
  private final long k0;
  private final long k1;

  private IdHash(Expression child, long k0, long k1) {
    super(child);
    this.k0 = k0;
    this.k1 = k1;
  }

  static Expression build(Seq<Expression> arguments) {
    List<Expression> args = CollectionConverters.asJava(arguments);
    if (args.size() != 2 || !args.get(0).dataType().equals(DataTypes.StringType) || !args.get(1).foldable()
        || !args.get(1).dataType().equals(DataTypes.StringType)) {
      throw new IllegalArgumentException("onceflow_id_hash(id, key): a STRING and a constant key of 16 bytes");
    }
    byte[] key = args.get(1).eval(null).toString().getBytes(StandardCharsets.UTF_8);
    if (key.length != 16) {
      throw new IllegalArgumentException("onceflow_id_hash: the key must be 16 bytes, not " + key.length);
    }
    return new IdHash(args.get(0), littleEndian(key, 0), littleEndian(key, 8));
  }

  private static long littleEndian(byte[] bytes, int from) {
    long word = 0;
    for (int i = 7; i >= 0; i--) {
      word = (word << 8) | (bytes[from + i] & 0xffL);
    }
    return word;
  }

  /** The hash of {@code id}'s UTF-8 bytes under the key {@code (k0, k1)}. */
  public static long hash(UTF8String id, long k0, long k1) {
    Object base = id.getBaseObject();
    long offset = id.getBaseOffset();
    int size = id.numBytes();
    SipHash state = new SipHash(k0, k1);
    int whole = size - size % 8;
    for (int i = 0; i < whole; i += 8) {
      long word = Platform.getLong(base, offset + i);
      state.absorb(LITTLE_ENDIAN ? word : Long.reverseBytes(word));
    }
    long last = ((long) size) << 56;
    for (int i = whole; i < size; i++) {
      last |= (Platform.getByte(base, offset + i) & 0xffL) << (8 * (i - whole));
    }
    state.absorb(last);
    long h = state.finish();
    h ^= h >>> 30;  // pandas' redistribution of the 64-bit values (`_hash_ndarray`)
    h *= 0xbf58476d1ce4e5b9L;
    h ^= h >>> 27;
    h *= 0x94d049bb133111ebL;
    return h ^ (h >>> 31);
  }

  /** SipHash-2-4's state (the JIT keeps it in registers: it never leaves {@link #hash}). */
  private static final class SipHash {
    private long v0;
    private long v1;
    private long v2;
    private long v3;

    SipHash(long k0, long k1) {
      v0 = k0 ^ 0x736f6d6570736575L;
      v1 = k1 ^ 0x646f72616e646f6dL;
      v2 = k0 ^ 0x6c7967656e657261L;
      v3 = k1 ^ 0x7465646279746573L;
    }

    void absorb(long word) {
      v3 ^= word;
      rounds(2);
      v0 ^= word;
    }

    long finish() {
      v2 ^= 0xff;
      rounds(4);
      return v0 ^ v1 ^ v2 ^ v3;
    }

    private void rounds(int count) {
      for (int i = 0; i < count; i++) {
        v0 += v1;
        v1 = Long.rotateLeft(v1, 13) ^ v0;
        v0 = Long.rotateLeft(v0, 32);
        v2 += v3;
        v3 = Long.rotateLeft(v3, 16) ^ v2;
        v0 += v3;
        v3 = Long.rotateLeft(v3, 21) ^ v0;
        v2 += v1;
        v1 = Long.rotateLeft(v1, 17) ^ v2;
        v2 = Long.rotateLeft(v2, 32);
      }
    }
  }

  @Override
  protected Object call(Object argument) {
    return hash((UTF8String) argument, k0, k1);
  }

  @Override
  protected String callCode(CodegenContext ctx, String argument) {
    return IdHash.class.getName() + ".hash(" + argument + ", " + k0 + "L, " + k1 + "L)";
  }

  @Override
  protected CompiledFunction withChild(Expression newChild) {
    return new IdHash(newChild, k0, k1);
  }

  @Override
  protected List<Object> settings() {
    return List.of(k0, k1);
  }

  @Override
  public DataType dataType() {
    return DataTypes.LongType;
  }

  @Override
  public String prettyName() {
    return "onceflow_id_hash";
  }
}
