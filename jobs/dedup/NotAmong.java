package io.onceflow;

import java.nio.ByteBuffer;

import org.apache.spark.sql.api.java.UDF2;

/**
 * Whether a value is absent from a set of longs given as one binary value: the set's members sorted ascending, 8
 * big-endian bytes each. Registered as the SQL function {@code onceflow_not_among(set, value)}, it drops a batch's
 * repeated and already-committed records by their ordinals: a binary search over the set as it arrives (one
 * literal, shared by every row of a task), where a join would first build and broadcast a table of them.
 */
public final class NotAmong implements UDF2<byte[], Long, Boolean> {
  private static final long serialVersionUID = 1L;

  @Override
  public Boolean call(byte[] set, Long value) {
    ByteBuffer members = ByteBuffer.wrap(set);
    long wanted = value;
    int low = 0;
    int high = set.length / Long.BYTES - 1;
    while (low <= high) {
      int middle = (low + high) >>> 1;
      long member = members.getLong(middle * Long.BYTES);
      if (member < wanted) {
        low = middle + 1;
      } else if (member > wanted) {
        high = middle - 1;
      } else {
        return false;
      }
    }
    return true;
  }
}
