package io.keyedstate.service

import java.io.IOException
import java.nio.charset.StandardCharsets.UTF_8
import java.nio.file.{Files, Path, Paths, StandardCopyOption}
import java.nio.file.attribute.PosixFilePermissions

import scala.util.control.NonFatal

import org.json4s.{DefaultFormats, Formats}
import org.json4s.jackson.Serialization

/**
 * Where the running queries of this machine's applications are served, so that a tool given only a
 * query's checkpoint (`keyedstate savepoint create --checkpoint C`) asks the query's application
 * instead of doing the work in another. One file per running query in a folder of the user's
 * (`~/.keyedstate/services`, or `$KEYEDSTATE_SERVICE_REGISTRY`), readable by the user only, as
 * it holds the token; the checkpoint itself is not written to. A service bound to loopback (the
 * default) is reachable from this machine only, which is where this registry is read. An entry
 * of an application that died stays until its query's next run replaces it: a reader asks the
 * service before it trusts one.
 */
final case class ServiceEntry(url: String, token: String, queryId: String, runId: String, checkpoint: String,
    applicationId: String, pid: Long, writtenAtMs: Long)

object ServiceRegistry {
  val EnvVariable = "KEYEDSTATE_SERVICE_REGISTRY"
  private implicit val formats: Formats = DefaultFormats

  def folder: Path = Option(System.getenv(EnvVariable)).filter(_.nonEmpty).map(Paths.get(_))
    .getOrElse(Paths.get(System.getProperty("user.home"), ".keyedstate", "services"))

  private def entryPath(queryId: String): Path = folder.resolve(s"$queryId.json")

  /** Publishes `entry` (replacing its query's previous run), by a rename: a reader never sees half a file. */
  def publish(entry: ServiceEntry): Unit = {
    val dir = folder
    Files.createDirectories(dir)
    val tmp = Files.createTempFile(dir, s".${entry.queryId}", ".tmp")
    try {
      ownerOnly(tmp)
      Files.write(tmp, Serialization.write(entry).getBytes(UTF_8))
      Files.move(tmp, entryPath(entry.queryId), StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE)
    } finally Files.deleteIfExists(tmp)
  }

  /** Removes the query's entry if it still is of `runId` (a restarted run may have published its own). */
  def withdraw(queryId: String, runId: String): Unit = {
    val path = entryPath(queryId)
    val current = try Some(new String(Files.readAllBytes(path), UTF_8)) catch { case _: IOException => None }
    current.filter(text => try Serialization.read[ServiceEntry](text).runId == runId catch { case NonFatal(_) => true })
      .foreach(_ => Files.deleteIfExists(path))
  }

  private def ownerOnly(path: Path): Unit =
    try Files.setPosixFilePermissions(path, PosixFilePermissions.fromString("rw-------")) catch {
      case _: UnsupportedOperationException => () // not a POSIX file system: its own rules apply
    }
}
