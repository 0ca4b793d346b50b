package io.onceflow;

import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Optional;
import org.apache.spark.connect.proto.Relation;
import org.apache.spark.sql.catalyst.plans.logical.LocalRelation;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.classic.Dataset;
import org.apache.spark.sql.classic.SparkSession;
import org.apache.spark.sql.connect.planner.SparkConnectPlanner;
import org.apache.spark.sql.connect.plugin.RelationPlugin;
import org.sparkproject.connect.protobuf.Any;

/**
 * A Spark Connect server's {@link LocalProjection}: a client's projection of rows it sends (a {@code Project} over
 * a {@code LocalRelation}, its columns named or not), wrapped in a relation extension of type {@link #TYPE_URL},
 * evaluated on the server's driver without a Spark job, its expressions analysed and optimized once per session
 * (for as long as that session's settings stay the same) and not once per call. The answer is a local relation of
 * the projected rows: what the job would have returned.
 *
 * <p>Any other relation of that type is planned as Spark plans it, so the plugin changes how fast, never what.
 * Registered with {@code spark.connect.extensions.relation.classes}.
 */
public final class ProjectionPlugin implements RelationPlugin {
  public static final String TYPE_URL = "type.googleapis.com/io.onceflow.LocalProjection";
  private static final int KEPT = 32;
  private static final Map<String, LocalProjection> PROJECTIONS = new LinkedHashMap<>(16, 0.75f, true) {
    @Override
    protected boolean removeEldestEntry(Map.Entry<String, LocalProjection> eldest) {
      return size() > KEPT;
    }
  };

  @Override
  public Optional<LogicalPlan> transform(byte[] extension, SparkConnectPlanner planner) {
    Relation relation;
    try {
      Any any = Any.parseFrom(extension);
      if (!TYPE_URL.equals(any.getTypeUrl())) {
        return Optional.empty();
      }
      relation = Relation.parseFrom(any.getValue());
    } catch (org.sparkproject.connect.protobuf.InvalidProtocolBufferException error) {
      throw new IllegalArgumentException("not a relation of " + TYPE_URL, error);
    }
    // The rows: a local relation, which `createDataFrame` names its columns over (`to_df`).
    Relation input = relation.getProject().getInput();
    Relation local = input.hasToDf() ? input.getToDf().getInput() : input;
    if (!relation.hasProject() || !local.hasLocalRelation()
        || !(planner.transformRelation(local) instanceof LocalRelation rows)) {
      return Optional.of(planner.transformRelation(relation));
    }
    // The template: the projection over no rows (of the rows' schema), without the ids the client gives each plan
    // it builds.
    Relation none = local.toBuilder().clearCommon()
        .setLocalRelation(local.getLocalRelation().toBuilder().clearData().setSchema(rows.schema().json())).build();
    Relation over = input.hasToDf()
        ? input.toBuilder().clearCommon().setToDf(input.getToDf().toBuilder().setInput(none)).build() : none;
    Relation template = relation.toBuilder().clearCommon()
        .setProject(relation.getProject().toBuilder().setInput(over)).build();
    SparkSession session = planner.session();
    String key = planner.sessionId() + " " + PlanTemplate.settings(session) + " "
        + PlanTemplate.digest(template.toByteArray());
    LocalProjection projection;
    synchronized (PROJECTIONS) {
      projection = PROJECTIONS.get(key);
    }
    if (projection == null) {
      projection = LocalProjection.over(Dataset.ofRows(session, planner.transformRelation(template)));
      synchronized (PROJECTIONS) {
        PROJECTIONS.put(key, projection);
      }
    }
    return Optional.of(projection.relation(rows.data()));
  }
}
