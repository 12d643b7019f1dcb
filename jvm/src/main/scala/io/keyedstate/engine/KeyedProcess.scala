package io.keyedstate.engine

import org.apache.spark.sql.DataFrame
import org.apache.spark.sql.keyedstate.KeyedProcessSqlBridge
import org.apache.spark.sql.types.{DataType, StructType}

/**
 * Entry points for the Python planner (through py4j): wrap a keyed stream's DataFrame in the
 * lookup node, and the DataFrame Python's `mapInArrow` returned in the apply node.
 */
object KeyedProcess {
  /**
   * The rows Python reads (docs/python-api.md, "Engine"): `df` grouped by key with its state,
   * and `broadcast` (null without one), every partition's broadcast elements.
   */
  def lookup(df: DataFrame, broadcast: DataFrame, specJson: String): DataFrame = {
    val spec = ProcessSpec.fromJson(specJson)
    val input = df.schema
    val missing = spec.keyColumns.filterNot(input.fieldNames.contains)
    require(missing.isEmpty, s"no key column ${missing.mkString(", ")} in ${input.fieldNames.mkString(", ")}")
    require((broadcast == null) == spec.broadcastSchema.isEmpty, "a broadcast stream comes with its schema in the spec")
    // The input's schema as the user declared it: normalizing float keys may loosen the
    // nullability of nested fields, and the state's key schema must not depend on that.
    val plan = KeyedStateLookup(specJson, input, KeyedProcessPlan.attributes(Exchange.inSchema(spec, input)),
      KeyColumns.normalized(spec.keyColumns, KeyedProcessSqlBridge.logicalPlan(df)),
      Option(broadcast).map(KeyedProcessSqlBridge.logicalPlan))
    KeyedProcessSqlBridge.ofRows(df.sparkSession, plan)
  }

  /** The schema Python's function returns, as JSON. */
  def outSchemaJson(specJson: String, inputSchemaJson: String): String =
    Exchange.outSchema(ProcessSpec.fromJson(specJson), DataType.fromJson(inputSchemaJson).asInstanceOf[StructType]).json

  /** The keyed function's result: outputs, with the state mutations applied and committed. */
  def apply(df: DataFrame, specJson: String, inputSchemaJson: String): DataFrame = {
    val spec = ProcessSpec.fromJson(specJson)
    val input = DataType.fromJson(inputSchemaJson).asInstanceOf[StructType]
    val plan = KeyedStateApply(specJson, input, KeyedProcessPlan.attributes(spec.outputSchema),
      KeyedProcessSqlBridge.logicalPlan(df))
    KeyedProcessSqlBridge.ofRows(df.sparkSession, plan)
  }
}
