package io.keyedstate.engine

import org.apache.spark.sql.catalyst.expressions.{Attribute, AttributeReference, AttributeSet}
import org.apache.spark.sql.catalyst.plans.logical.{LogicalPlan, UnaryNode}
import org.apache.spark.sql.types.StructType

/**
 * The logical half of a keyed function: `KeyedStateLookup` (input rows and the state of their
 * keys, grouped by key) → Spark's own `MapInArrow` (the Python function) → `KeyedStateApply`
 * (outputs out, state mutations into the store, commit). Output attributes are constructor
 * arguments so that they keep their ids through every copy of the plan.
 */
/** What both nodes share: the spec, their own output, and reading every column of the child. */
sealed trait KeyedFunctionNode extends UnaryNode {
  def specJson: String
  @transient lazy val spec: ProcessSpec = ProcessSpec.fromJson(specJson)
  override def producedAttributes: AttributeSet = AttributeSet(output)
  // ColumnPruning would otherwise prune every column of the child away.
  override lazy val references: AttributeSet = child.outputSet
  override def simpleString(maxFields: Int): String =
    s"$nodeName ${spec.functionName} by ${spec.keyColumns.mkString(", ")}"
}

final case class KeyedStateLookup(
    specJson: String,
    inputSchema: StructType,
    output: Seq[Attribute],
    child: LogicalPlan) extends KeyedFunctionNode {
  override protected def withNewChildInternal(newChild: LogicalPlan): KeyedStateLookup = copy(child = newChild)
}

final case class KeyedStateApply(
    specJson: String,
    inputSchema: StructType,
    output: Seq[Attribute],
    child: LogicalPlan) extends KeyedFunctionNode {
  override protected def withNewChildInternal(newChild: LogicalPlan): KeyedStateApply = copy(child = newChild)
}

object KeyedProcessPlan {
  def attributes(schema: StructType): Seq[Attribute] =
    schema.fields.toSeq.map(f => AttributeReference(f.name, f.dataType, f.nullable, f.metadata)())
}
