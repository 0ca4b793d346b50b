package io.onceflow;

import java.io.IOException;
import java.io.UncheckedIOException;
import java.net.URI;

import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataInputStream;
import org.apache.hadoop.fs.Path;
import org.apache.spark.SparkEnv;
import org.apache.spark.TaskContext;
import org.apache.spark.sql.api.java.UDF5;
import scala.Tuple2;

/**
 * The byte offset of each line Spark's text source reads, summed from the lengths of the lines before it in its
 * split: exact offsets without the shuffle a window over every line would cost.
 *
 * <p>Called as the SQL function {@code onceflow_line_offset} once per line, in read order, with the line's file,
 * the start of the split it was read from, its length in bytes including its "\n", for a split that starts inside
 * the file its URI as Spark listed it, and a nondeterministic value it ignores ({@code monotonically_increasing_id()}):
 * a call with a nondeterministic argument is nondeterministic to Spark, so it neither reorders, repeats nor filters
 * the calls, and, unlike {@code reflect}, it is compiled into its stage's generated code. The URI is opened
 * through Hadoop's file systems, as the executor's scan did: never a driver-local path.
 * A thread runs one task at a time and a task reads its splits line by line, so the running offset is kept per
 * thread and starts again with each task and each split. A split that starts inside a file begins, as Hadoop's
 * line reader does, at the line after the first "\n" at or after its start.
 */
public final class LineOffsets implements UDF5<Integer, Long, Integer, String, Long, Long> {
  private static final ThreadLocal<Cursor> CURSOR = ThreadLocal.withInitial(Cursor::new);

  /** Where the thread's running offset is: its task, file and split, and the offset of the next line. */
  private static final class Cursor {
    private long task = -1;
    private int file = -1;
    private long block = -1;
    private long next;
  }

  @Override
  public Long call(Integer file, Long block, Integer size, String uri, Long nondeterministic) {
    return offset(file, block, size, uri);
  }

  /**
   * The offset of the line of {@code size} bytes read next from the split at {@code block} of file number {@code
   * file}, whose {@code uri} is needed (and given) only where {@code block} is not 0.
   */
  public static long offset(int file, long block, int size, String uri) {
    Cursor cursor = CURSOR.get();
    TaskContext context = TaskContext.get();
    long task = context == null ? -1 : context.taskAttemptId();
    if (task != cursor.task || file != cursor.file || block != cursor.block) {
      cursor.task = task;
      cursor.file = file;
      cursor.block = block;
      cursor.next = block == 0 ? 0 : firstLineAt(uri, block);
    }
    long offset = cursor.next;
    cursor.next += size;
    return offset;
  }

  private static long firstLineAt(String uri, long start) {
    Path path = new Path(URI.create(uri));
    try (FSDataInputStream in = path.getFileSystem(hadoopConf()).open(path)) {
      in.seek(start);
      byte[] buffer = new byte[1 << 16];
      long position = start;
      for (int read = in.read(buffer); read > 0; read = in.read(buffer)) {
        for (int i = 0; i < read; i++) {
          position++;
          if (buffer[i] == '\n') {
            return position;
          }
        }
      }
      return position;
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  /** Hadoop's settings as the engine was given them ({@code spark.hadoop.*}): a store's scheme and credentials. */
  private static Configuration hadoopConf() {
    Configuration conf = new Configuration();
    SparkEnv env = SparkEnv.get();
    if (env != null) {
      for (Tuple2<String, String> setting : env.conf().getAllWithPrefix("spark.hadoop.")) {
        conf.set(setting._1(), setting._2());
      }
    }
    return conf;
  }
}
