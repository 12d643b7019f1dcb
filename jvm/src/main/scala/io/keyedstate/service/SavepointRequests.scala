package io.keyedstate.service

import java.util.UUID
import java.util.concurrent.{ExecutorService, RejectedExecutionException}

import scala.collection.mutable
import scala.util.control.NonFatal

import org.json4s.JValue
import org.json4s.JsonDSL._
import org.json4s.jackson.JsonMethods

import io.keyedstate.offline.savepoint.SavepointCommands
import io.keyedstate.shims.SparkTypes.StreamExecution

/**
 * The savepoints the service was asked for (Flink's trigger id): each runs on `runner`, in the
 * query's own session, through the entry point the Python package calls
 * ([[SavepointCommands.create]]), so it yields to the query's batches as an in-application
 * savepoint does. The last [[SavepointRequests.Kept]] requests are remembered.
 */
private[service] final class SavepointRequests(runner: ExecutorService) {
  import SavepointRequests._

  private val requests = mutable.LinkedHashMap.empty[String, Request]

  def trigger(query: StreamExecution, target: String, format: String): String = {
    val id = UUID.randomUUID().toString
    val request = new Request(query.id.toString, target, format)
    requests.synchronized {
      requests.put(id, request)
      // The oldest finished requests go first; those in progress are always answered.
      val finished = requests.iterator.filter(_._2.status != InProgress).map(_._1).toSeq
      finished.take(requests.size - SavepointRequests.Kept).foreach(requests.remove)
    }
    try {
      runner.execute { () =>
        request.status = try {
          Completed(SavepointCommands.create(query.sparkSession, query.resolvedCheckpointRoot, target, format))
        } catch {
          case NonFatal(e) => Failed(QueryService.errorOf(e))
        }
      }
    } catch {
      case e: RejectedExecutionException => request.status = Failed(QueryService.errorOf(e)) // the service stopped
    }
    id
  }

  /** The request's status as the service answers it, if the request is one of `queryId`'s. */
  def status(queryId: String, id: String): Option[JValue] =
    requests.synchronized(requests.get(id)).filter(_.queryId == queryId).map { r =>
      val common = ("request_id" -> id) ~ ("target" -> r.target) ~ ("format" -> r.format)
      r.status match {
        case InProgress => common ~ ("status" -> "in_progress")
        case Completed(savepoint) => common ~ ("status" -> "completed") ~ ("savepoint" -> JsonMethods.parse(savepoint))
        case Failed(error) => common ~ ("status" -> "failed") ~ ("error" -> error)
      }
    }
}

private[service] object SavepointRequests {
  val Kept = 100

  private sealed trait Status
  private case object InProgress extends Status
  private final case class Completed(savepoint: String) extends Status
  private final case class Failed(error: JValue) extends Status

  private final class Request(val queryId: String, val target: String, val format: String) {
    @volatile var status: Status = InProgress
  }
}
