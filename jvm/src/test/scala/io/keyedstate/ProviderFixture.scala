package io.keyedstate

import java.io.File
import java.nio.file.Files
import java.util.UUID

import org.apache.hadoop.conf.Configuration
import org.apache.spark.sql.catalyst.InternalRow
import org.apache.spark.sql.catalyst.expressions.{UnsafeProjection, UnsafeRow}
import org.apache.spark.sql.execution.streaming.state._
import org.apache.spark.sql.internal.SQLConf
import org.apache.spark.sql.types._
import org.apache.spark.unsafe.types.UTF8String

import io.keyedstate.checkpoint.LocalFiles

/** Builds real providers over a real local checkpoint directory, and rows to put in them. */
trait ProviderFixture {
  val keySchema: StructType = StructType(Seq(StructField("k", StringType), StructField("n", IntegerType)))
  val valueSchema: StructType = StructType(Seq(StructField("v", LongType)))

  private val keyProj = UnsafeProjection.create(keySchema)
  private val valueProj = UnsafeProjection.create(valueSchema)
  private val prefixProj = UnsafeProjection.create(StructType(Seq(keySchema.head)))

  def key(k: String, n: Int = 0): UnsafeRow =
    keyProj(InternalRow(UTF8String.fromString(k), n)).copy()
  def prefix(k: String): UnsafeRow = prefixProj(InternalRow(UTF8String.fromString(k))).copy()
  def value(v: Long): UnsafeRow = valueProj(InternalRow(v)).copy()
  def keyOf(row: UnsafeRow): (String, Int) = (row.getUTF8String(0).toString, row.getInt(1))

  def tempDir(): File = {
    val d = Files.createTempDirectory("keyedstate-test").toFile
    sys.addShutdownHook(LocalFiles.deleteRecursively(d))
    d
  }

  def storeConf(settings: (String, String)*): StateStoreConf = {
    val sql = new SQLConf()
    // These tests drive the provider directly: there is no driver coordinator to report to.
    sql.setConfString("spark.sql.streaming.stateStore.commitValidation.enabled", "false")
    settings.foreach { case (k, v) => sql.setConfString(k, v) }
    new StateStoreConf(sql)
  }

  def newProvider(
      checkpointRoot: File,
      conf: StateStoreConf = storeConf(),
      spec: KeyStateEncoderSpec = null,
      useColumnFamilies: Boolean = false,
      multipleValues: Boolean = false,
      partition: Int = 0): KeyedStateStoreProvider = {
    val p = new KeyedStateStoreProvider
    p.init(StateStoreId(checkpointRoot.getAbsolutePath, 0, partition), keySchema, valueSchema,
      Option(spec).getOrElse(NoPrefixKeyStateEncoderSpec(keySchema)), useColumnFamilies, conf,
      new Configuration(), multipleValues, None)
    p
  }

  def contents(store: ReadStateStore, cf: String = StateStore.DEFAULT_COL_FAMILY_NAME): Map[(String, Int), Long] = {
    val it = store.iterator(cf)
    try it.map(p => keyOf(p.key) -> p.value.getLong(0)).toMap finally it.close()
  }

  def partitionDir(checkpointRoot: File, partition: Int = 0): File =
    new File(checkpointRoot, s"0/$partition")

  def uniqueName(): String = UUID.randomUUID().toString.take(8)
}
