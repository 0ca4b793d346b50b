package io.onceflow;

import org.apache.spark.sql.SparkSessionExtensions;
import org.apache.spark.sql.catalyst.FunctionIdentifier;
import org.apache.spark.sql.catalyst.expressions.ExpressionInfo;
import scala.Function1;
import scala.Tuple3;
import scala.runtime.BoxedUnit;

/**
 * onceflow's compiled functions ({@link CompiledFunction#builders}) in every session of an engine started with
 * {@code spark.sql.extensions=io.onceflow.SessionFunctions}: a Spark Connect server's sessions, which no client can
 * register an expression in, compile a batch as a classic session does.
 */
public final class SessionFunctions implements Function1<SparkSessionExtensions, BoxedUnit> {
  @Override
  public BoxedUnit apply(SparkSessionExtensions extensions) {
    CompiledFunction.builders().forEach((name, builder) -> extensions.injectFunction(
        new Tuple3<>(FunctionIdentifier.apply(name), new ExpressionInfo(SessionFunctions.class.getName(), name),
            builder)));
    return BoxedUnit.UNIT;
  }
}
