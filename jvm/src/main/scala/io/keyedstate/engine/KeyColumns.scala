package io.keyedstate.engine

import org.apache.spark.sql.catalyst.expressions.{Alias, NamedExpression}
import org.apache.spark.sql.catalyst.plans.logical.{LogicalPlan, Project}
import org.apache.spark.sql.keyedstate.KeyedProcessSqlBridge

/**
 * Key columns in the one byte form per key that state needs. Spark's sort and grouping take
 * -0.0 and 0.0 as equal, and every NaN as one value; their bytes differ. Keyed by bytes, such
 * keys would be two keys, or one key whose elements the sort interleaves with the other's: the
 * lookup would read it twice, each time as the batch found it, and lose the first group's writes.
 * So float and double key columns (inside structs and arrays too) are normalized first, as
 * Spark's `groupBy` does: the function, its outputs and its state see 0.0 and one NaN.
 */
private[engine] object KeyColumns {
  def normalized(keyColumns: Seq[String], plan: LogicalPlan): LogicalPlan = {
    val keys = keyColumns.toSet
    def needs(a: NamedExpression): Boolean = keys(a.name) && KeyedProcessSqlBridge.needsFloatNormalization(a.dataType)
    if (!plan.output.exists(needs)) plan
    else Project(plan.output.map { a =>
      if (needs(a)) Alias(KeyedProcessSqlBridge.normalizeFloats(a), a.name)(explicitMetadata = Some(a.metadata)) else a
    }, plan)
  }
}
