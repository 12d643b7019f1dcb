package io.keyedstate.engine

import org.apache.spark.sql.catalyst.expressions.{Attribute, AttributeReference, AttributeSet}
import org.apache.spark.sql.catalyst.plans.logical.{LogicalPlan, UnaryNode}
import org.apache.spark.sql.types.StructType

/**
 * The logical half of a keyed function: `KeyedStateLookup` (input rows and the state of their
 * keys, grouped by key, and the broadcast stream it is connected to, if any) → Spark's own
 * `MapInArrow` (the Python function) → `KeyedStateApply` (outputs out, state mutations into the
 * store, commit). Output attributes are constructor arguments so that they keep their ids
 * through every copy of the plan. Both nodes share the spec, their own output, and reading
 * every column of their children.
 */
sealed trait KeyedFunctionNode extends LogicalPlan {
  def specJson: String
  @transient lazy val spec: ProcessSpec = ProcessSpec.fromJson(specJson)
  override def producedAttributes: AttributeSet = AttributeSet(output)
  // ColumnPruning would otherwise prune every column of the children away.
  override lazy val references: AttributeSet = AttributeSet(children.flatMap(_.output))
  override def simpleString(maxFields: Int): String =
    s"$nodeName ${spec.functionName} by ${spec.keyColumns.mkString(", ")}"
}

/** The lookup reads the keyed stream (`child`) and, connected to it, the broadcast stream. */
final case class KeyedStateLookup(
    specJson: String,
    inputSchema: StructType,
    output: Seq[Attribute],
    child: LogicalPlan,
    broadcast: Option[LogicalPlan]) extends KeyedFunctionNode {
  override def children: Seq[LogicalPlan] = child +: broadcast.toSeq
  override protected def withNewChildrenInternal(newChildren: IndexedSeq[LogicalPlan]): KeyedStateLookup =
    copy(child = newChildren.head, broadcast = broadcast.map(_ => newChildren(1)))
}

final case class KeyedStateApply(
    specJson: String,
    inputSchema: StructType,
    output: Seq[Attribute],
    child: LogicalPlan) extends KeyedFunctionNode with UnaryNode {
  override protected def withNewChildInternal(newChild: LogicalPlan): KeyedStateApply = copy(child = newChild)
}

object KeyedProcessPlan {
  def attributes(schema: StructType): Seq[Attribute] =
    schema.fields.toSeq.map(f => AttributeReference(f.name, f.dataType, f.nullable, f.metadata)())
}
