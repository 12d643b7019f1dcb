package io.keyedstate.offline

import java.util.UUID

import scala.util.control.NonFatal

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.Path
import org.apache.spark.sql.execution.streaming.state.{StateSchemaCompatibilityChecker, StateStoreId, StateStoreProviderId}
import org.json4s._
import org.json4s.jackson.Serialization

/** The key and value schema of one column family of a store, as Spark's schema file holds them. */
final case class StoredSchema(operatorId: Int, operatorName: String, storeName: String, keySchema: String, valueSchema: String)

/**
 * The state schemas of every stateful operator of a checkpoint, read with Spark's own schema
 * reader. Spark refuses a changed schema on restart naming only the two schemas; the Python side
 * uses these to name the operator whose stored schema it is.
 */
object StoredSchemas {
  private implicit val formats: Formats = DefaultFormats

  def read(ckpt: QueryCheckpoint): Seq[StoredSchema] = ckpt.operators.flatMap { op =>
    val name = ckpt.operatorName(op)
    val stores = Some(ckpt.operatorStoreNames(op)).filter(_.nonEmpty).getOrElse(Seq(StateStoreId.DEFAULT_STORE_NAME))
    stores.flatMap { store =>
      val storeId = StateStoreId(ckpt.stateRoot.toString, op, 0, store)
      val checker = new StateSchemaCompatibilityChecker(
        StateStoreProviderId(storeId, UUID.randomUUID()), ckpt.hadoopConf)
      // A store without a schema file (one Spark did not write) has nothing to name.
      val families = try checker.readSchemaFile() catch { case NonFatal(_) => Nil }
      families.map(f => StoredSchema(op, name, store, f.keySchema.toString, f.valueSchema.toString))
    }
  }

  /** The entry point of the Python package: the schemas as JSON (read with the context's Hadoop
   *  configuration: no active session is needed in the calling thread). */
  def json(checkpoint: String, hadoopConf: Configuration): String =
    Serialization.write(read(new QueryCheckpoint(new Path(checkpoint), hadoopConf)))
}
