package io.onceflow;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.nio.channels.FileChannel;
import java.nio.file.Path;

import org.apache.spark.TaskContext;

/**
 * The byte offset of each line Spark's text source reads, summed from the lengths of the lines before it in its
 * split: exact offsets without the shuffle a window over every line would cost.
 *
 * <p>Called through Spark's {@code reflect} (which Spark treats as nondeterministic, so it neither reorders,
 * repeats nor filters the calls) once per line, in read order, with the line's file, the start of the split it
 * was read from, its length in bytes including its "\n" and, for a split that starts inside the file, its path.
 * A thread runs one task at a time and a task reads its splits line by line, so the running offset is kept per
 * thread and starts again with each task and each split. A split that starts inside a file begins, as Hadoop's
 * line reader does, at the line after the first "\n" at or after its start.
 */
public final class LineOffsets {
  private static final ThreadLocal<LineOffsets> CURSOR = ThreadLocal.withInitial(LineOffsets::new);

  private long task = -1;
  private int file = -1;
  private long block = -1;
  private long next;

  private LineOffsets() {}

  /**
   * The offset of the line of {@code size} bytes read next from the split at {@code block} of file number {@code
   * file}, whose {@code path} is needed (and given) only where {@code block} is not 0.
   */
  public static long offset(int file, long block, int size, String path) {
    LineOffsets cursor = CURSOR.get();
    TaskContext context = TaskContext.get();
    long task = context == null ? -1 : context.taskAttemptId();
    if (task != cursor.task || file != cursor.file || block != cursor.block) {
      cursor.task = task;
      cursor.file = file;
      cursor.block = block;
      cursor.next = block == 0 ? 0 : firstLineAt(path, block);
    }
    long offset = cursor.next;
    cursor.next += size;
    return offset;
  }

  private static long firstLineAt(String path, long start) {
    try (FileChannel channel = FileChannel.open(Path.of(path))) {
      ByteBuffer buffer = ByteBuffer.allocate(1 << 16);
      long position = start;
      while (channel.read(buffer, position) > 0) {
        buffer.flip();
        while (buffer.hasRemaining()) {
          position++;
          if (buffer.get() == '\n') {
            return position;
          }
        }
        buffer.clear();
      }
      return position;
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }
}
