package io.keyedstate.engine

import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{GenericInternalRow, UnsafeProjection, UnsafeRow}
import org.apache.spark.sql.catalyst.util.GenericArrayData
import org.apache.spark.sql.execution.streaming.state.{NoPrefixKeyStateEncoderSpec, StateStore, StateStoreId}
import org.apache.spark.sql.types._

import io.keyedstate.rocks.ColumnFamilyCodec

/**
 * A keyed function's operator state in its store (`$op_<name>`): per partition one entry, keyed by
 * the partition that wrote it, whose value is the whole list. Until a restored query's first batch
 * rewrites them, a store may hold the lists of several old partitions (a rescaled union state).
 */
object OperatorLists {
  val KeySchema: StructType = StructType(Seq(StructField("partition", IntegerType, nullable = false)))

  def family(v: StateVar): Family = {
    require(v.kind.isOperatorState, s"${v.name} is ${v.kind.name} state, not operator state")
    Family(v.columnFamily, KeySchema, valueSchema(v.valueType), NoPrefixKeyStateEncoderSpec(KeySchema),
      multipleValues = false)
  }

  def valueSchema(elementType: DataType): StructType =
    StructType(Seq(StructField("value", ArrayType(elementType, containsNull = false), nullable = true)))

  def partitionKey(partition: Int): UnsafeRow =
    UnsafeProjection.create(Array[DataType](IntegerType))(InternalRow(partition)).copy()

  /** Replaces every list stored in `cf` by `value` (this partition's), none if it is null or empty. */
  def replace(store: StateStore, cf: String, partitionKey: UnsafeRow, value: UnsafeRow): Unit = {
    val it = store.iterator(cf)
    val stored = try it.map(_.key.copy()).toVector finally it.close()
    stored.foreach(store.remove(_, cf))
    if (!value.isNullAt(0) && value.getArray(0).numElements() > 0) store.put(partitionKey, value, cf)
  }

  def codec(v: StateVar): Codec = new Codec(v.columnFamily, v.valueType)

  /** Stored entries of one operator state as (partition, elements) and back (not thread-safe). */
  final class Codec(cf: String, val elementType: DataType) {
    private val schema = valueSchema(elementType)
    private val codec = new ColumnFamilyCodec(StateStoreId.DEFAULT_STORE_NAME, cf, KeySchema, schema,
      NoPrefixKeyStateEncoderSpec(KeySchema), multipleValues = false, isInternal = true)
    private val toRow = UnsafeProjection.create(schema)

    def valueRow(elements: Seq[Any]): UnsafeRow =
      toRow(new GenericInternalRow(Array[Any](new GenericArrayData(elements.toArray)))).copy()

    def decode(key: Array[Byte], value: Array[Byte]): (Int, Seq[Any]) = {
      val row = codec.decodeValue(value)
      codec.decodeKey(key).getInt(0) -> (if (row.isNullAt(0)) Nil else row.getArray(0).toSeq[Any](elementType))
    }

    def encode(partition: Int, elements: Seq[Any]): (Array[Byte], Array[Byte]) =
      codec.encodeKey(partitionKey(partition)) -> codec.encodeValue(valueRow(elements), System.currentTimeMillis())
  }
}
