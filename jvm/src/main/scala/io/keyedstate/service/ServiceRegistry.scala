package io.keyedstate.service

import java.nio.charset.StandardCharsets.UTF_8
import java.nio.file.{Files, Path, Paths, StandardCopyOption}
import java.nio.file.attribute.PosixFilePermissions

import scala.util.control.NonFatal

import org.json4s.{DefaultFormats, Formats}
import org.json4s.jackson.Serialization

/**
 * Where the running queries of this machine's applications are served, so that a tool given only a
 * query's checkpoint (`keyedstate savepoint create --checkpoint C`) asks the query's application
 * instead of doing the work in another. One file per query run in a folder of the user's
 * (`~/.keyedstate/services`, or `$KEYEDSTATE_SERVICE_REGISTRY`), both readable by the user only,
 * as the files hold the token; the checkpoint itself is not written to (and a checkpoint restored
 * from a savepoint has the same query id: runs are unique). A service bound to loopback (the
 * default) is reachable from this machine only, which is where this registry is read. The entry
 * goes when the run stops, or the service, or the JVM; one of a process killed outright stays: a
 * reader checks the process and asks the service before it trusts one.
 */
final case class ServiceEntry(url: String, token: String, queryId: String, runId: String, checkpoint: String,
    applicationId: String, pid: Long, writtenAtMs: Long, stopped: Boolean = false)

object ServiceRegistry {
  val EnvVariable = "KEYEDSTATE_SERVICE_REGISTRY"
  private implicit val formats: Formats = DefaultFormats

  def folder: Path = Option(System.getenv(EnvVariable)).filter(_.nonEmpty).map(Paths.get(_))
    .getOrElse(Paths.get(System.getProperty("user.home"), ".keyedstate", "services"))

  private def entryPath(runId: String): Path = folder.resolve(s"$runId.json")

  /** Publishes `entry` by a rename: a reader never sees half a file. */
  def publish(entry: ServiceEntry): Unit = {
    val dir = folder
    if (!Files.isDirectory(dir)) {
      Files.createDirectories(dir)
      ownerOnly(dir, "rwx------")
    }
    val tmp = Files.createTempFile(dir, s".${entry.runId}", ".tmp")
    try {
      ownerOnly(tmp, "rw-------")
      Files.write(tmp, Serialization.write(entry).getBytes(UTF_8))
      Files.move(tmp, entryPath(entry.runId), StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE)
    } finally Files.deleteIfExists(tmp)
  }

  /** Removes the run's entry (none: nothing to do). */
  def withdraw(runId: String): Unit =
    try Files.deleteIfExists(entryPath(runId)) catch { case NonFatal(_) => () } // a registry that went: nothing to withdraw

  private def ownerOnly(path: Path, permissions: String): Unit =
    try Files.setPosixFilePermissions(path, PosixFilePermissions.fromString(permissions)) catch {
      case _: UnsupportedOperationException => () // not a POSIX file system: its own rules apply
    }
}
