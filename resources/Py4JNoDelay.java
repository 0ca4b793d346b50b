package io.onceflow;

import java.lang.reflect.Field;
import java.net.Socket;
import java.net.SocketException;
import py4j.ClientServerConnection;

/**
 * Turns Nagle's algorithm off on a classic session's Py4J connections (py4j/py4j#516, fixed upstream after the
 * py4j that Spark ships). A reply over Py4J's 8 KiB buffer goes out in two writes, and the second waited for the
 * first's delayed acknowledgement: 40 ms on every call with a large answer, such as a wide DataFrame's schema.
 */
public final class Py4JNoDelay {
  private Py4JNoDelay() {}

  /**
   * Set TCP_NODELAY on each Py4J connection of this JVM that lacks it, and say on how many; -1 where this JVM does
   * not show which connection a thread serves (a JDK whose threads keep their task elsewhere than Java 17's).
   */
  public static int apply() {
    try {
      Field task = Thread.class.getDeclaredField("target");
      task.setAccessible(true);
      ThreadGroup root = Thread.currentThread().getThreadGroup();
      while (root.getParent() != null) {
        root = root.getParent();
      }
      Thread[] threads = new Thread[root.activeCount() * 2 + 16];
      int count = root.enumerate(threads, true);
      int set = 0;
      for (int i = 0; i < count; i++) {
        if (task.get(threads[i]) instanceof ClientServerConnection connection) {
          Socket socket = connection.getSocket();
          if (!socket.getTcpNoDelay()) {
            socket.setTcpNoDelay(true);
            set++;
          }
        }
      }
      return set;
    } catch (ReflectiveOperationException | RuntimeException | SocketException error) {
      return -1;
    }
  }
}
