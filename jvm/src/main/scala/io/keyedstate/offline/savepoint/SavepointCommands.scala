package io.keyedstate.offline.savepoint

import scala.jdk.CollectionConverters._

import org.apache.spark.sql.{DataFrame, SparkSession}
import org.json4s.{DefaultFormats, Formats}
import org.json4s.jackson.JsonMethods.parse
import org.json4s.jackson.Serialization

import io.keyedstate.offline.{Progress, QueryCheckpoint, SavepointMetadata}

/** The entry points of the Python package and the CLI (`keyedstate savepoint ...`): results as JSON. */
object SavepointCommands {
  private implicit val formats: Formats = DefaultFormats

  private def withProgress(spark: SparkSession): Savepoints =
    new Savepoints(spark, Progress.of("savepoint"))

  def create(spark: SparkSession, checkpoint: String, target: String, format: String): String =
    Serialization.write(withProgress(spark).create(checkpoint, target, format))

  /** The state of `checkpoint` (a bootstrapping query's) as a savepoint a new query starts from. */
  def bootstrap(spark: SparkSession, checkpoint: String, target: String): String =
    Serialization.write(withProgress(spark).create(checkpoint, target, SavepointMetadata.Canonical, bootstrap = true))

  /**
   * Removes a bootstrap's work folder (`<target>.bootstrapping`: the input it wrote, the
   * bootstrapping query's checkpoint), if there is one; refuses any other folder.
   */
  def clearBootstrap(spark: SparkSession, work: String): String = {
    require(work.endsWith(BootstrapSuffix), s"a bootstrap's work folder ends with $BootstrapSuffix, not $work")
    val path = new org.apache.hadoop.fs.Path(work)
    val fs = path.getFileSystem(QueryCheckpoint.hadoopConf(spark))
    Serialization.write(Map("removed" -> (fs.exists(path) && fs.delete(path, true))))
  }

  val BootstrapSuffix = ".bootstrapping"

  /**
   * [[SavepointTransform]]: `renames` a JSON object (old uid to new), `drops` a JSON array of
   * [operator, state] pairs (state "": the whole keyed function), `additions` a JSON array of
   * [uid, savepoint] pairs, `replacements` the new rows of tables keyed by
   * `<operator>\u0000<state>`.
   */
  def transform(spark: SparkSession, source: String, target: String, renames: String, drops: String,
      additions: String, replacements: java.util.Map[String, DataFrame]): String = {
    val added = parse(additions).extract[List[List[String]]].map {
      case List(uid, from) => uid -> from
      case other => throw new IllegalArgumentException(s"an addition is [uid, savepoint], not $other")
    }
    val renamed = parse(renames).extract[Map[String, String]]
    val dropped = parse(drops).extract[List[List[String]]].map {
      case List(operator, state) => operator -> state
      case other => throw new IllegalArgumentException(s"a drop is [operator, state], not $other")
    }
    val replaced = replacements.asScala.toMap.map { case (key, rows) =>
      key.split("\u0000", 2) match {
        case Array(operator, state) => (operator, state) -> rows
        case _ => throw new IllegalArgumentException(s"a replaced table is named <operator>\\u0000<state>, not $key")
      }
    }
    val transform = new SavepointTransform(spark, Progress.of("savepoint"))
    Serialization.write(transform.run(source, target, renamed, dropped, replaced, added))
  }

  /** `partitions` 0: the savepoint's count; `provider` "": the one the savepoint's query used. */
  def restore(spark: SparkSession, savepoint: String, checkpoint: String, partitions: Int, provider: String,
      allowNonRestoredState: Boolean): String =
    Serialization.write(withProgress(spark).restore(savepoint, checkpoint, Option(partitions).filter(_ != 0),
      Option(provider).filter(_.nonEmpty), allowNonRestoredState))

  def inspect(spark: SparkSession, savepoint: String, verifyFiles: Boolean): String =
    Serialization.write(withProgress(spark).inspect(savepoint, verifyFiles))

  def list(spark: SparkSession, directory: String): String =
    Serialization.write(withProgress(spark).list(directory).map { case (path, m) =>
      Map("path" -> path, "metadata" -> m)
    })

  def dispose(spark: SparkSession, savepoint: String): String =
    Serialization.write(withProgress(spark).dispose(savepoint))
}
