package io.keyedstate

import java.net.URI

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.{FSDataInputStream, FSDataOutputStream, FileStatus, FileSystem, Path, RawLocalFileSystem}
import org.apache.hadoop.fs.permission.FsPermission
import org.apache.hadoop.util.Progressable

/** The suites' own file systems: how a Hadoop configuration reaches one. */
object TestFileSystems {
  /**
   * A new Hadoop configuration in which `scheme://` is served by `cls`, uncached: every store
   * (and every test) gets an instance of its own, as Hadoop's cache would otherwise share one.
   */
  def conf(scheme: String, cls: Class[_ <: FileSystem]): Configuration = {
    val c = new Configuration()
    c.set(s"fs.$scheme.impl", cls.getName)
    c.setBoolean(s"fs.$scheme.impl.disable.cache", true)
    c
  }
}

/**
 * A local file system on `scheme://` whose calls a test steers: each create, open, rename (by
 * its target), delete, mkdirs and listStatus first calls `before(what, path)`, which may hold or
 * fail it; `renamed(dst)` follows a rename that succeeded. Hadoop creates file systems
 * reflectively: a subclass takes no arguments and keeps its state in a companion object.
 */
abstract class InterceptedFileSystem(scheme: String) extends RawLocalFileSystem {
  override def getUri: URI = URI.create(s"$scheme:///")

  /** Called before each intercepted call: `what` is the call's name, `path` the path it touches. */
  protected def before(what: String, path: Path): Unit

  /** Called after a rename onto `dst` that succeeded. */
  protected def renamed(dst: Path): Unit = ()

  private def intercepted[T](what: String, path: Path)(call: => T): T = {
    before(what, path)
    call
  }

  override def create(f: Path, permission: FsPermission, overwrite: Boolean, bufferSize: Int, replication: Short,
      blockSize: Long, progress: Progressable): FSDataOutputStream =
    intercepted("create", f)(super.create(f, permission, overwrite, bufferSize, replication, blockSize, progress))
  override def create(f: Path, overwrite: Boolean, bufferSize: Int, replication: Short, blockSize: Long,
      progress: Progressable): FSDataOutputStream =
    intercepted("create", f)(super.create(f, overwrite, bufferSize, replication, blockSize, progress))
  override def open(f: Path, bufferSize: Int): FSDataInputStream = intercepted("open", f)(super.open(f, bufferSize))
  override def rename(src: Path, dst: Path): Boolean = intercepted("rename", dst) {
    val done = super.rename(src, dst)
    if (done) renamed(dst)
    done
  }
  override def delete(p: Path, recursive: Boolean): Boolean = intercepted("delete", p)(super.delete(p, recursive))
  override def mkdirs(p: Path, permission: FsPermission): Boolean =
    intercepted("mkdirs", p)(super.mkdirs(p, permission))
  override def listStatus(p: Path): Array[FileStatus] = intercepted("listStatus", p)(super.listStatus(p))
}
