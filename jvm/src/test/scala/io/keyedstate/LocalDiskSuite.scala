package io.keyedstate

import java.io.{File, IOException}
import java.net.URI
import java.nio.file.Files

import org.apache.hadoop.conf.Configuration
import org.apache.hadoop.fs.{FSDataOutputStream, Path, RawLocalFileSystem}
import org.apache.hadoop.fs.permission.FsPermission
import org.apache.hadoop.util.Progressable
import org.apache.spark.SparkException
import org.apache.spark.sql.execution.streaming.state._
import org.scalatest.funsuite.AnyFunSuite

import io.keyedstate.checkpoint.{CheckpointStore, ManifestFile}
import io.keyedstate.checkpoint.commit.Changelog
import io.keyedstate.conf.KeyedStateConf
import io.keyedstate.errors.LocalDiskException

/**
 * The executor's local disk failing under the provider (tests/storage/test_storage_outages.py fills a
 * real one): every write there that fails names the file, the local directory and the reason,
 * and a failed commit leaves no local file behind. A full disk is played by `/dev/full` (every
 * write fails with ENOSPC), reached through a symbolic link in the place of the file.
 */
class LocalDiskSuite extends AnyFunSuite with ProviderFixture {

  /** `<dir>/keyedstate/jvm-x/<name>`, a link to /dev/full: a file keyedstate writes on a full disk. */
  private def fullDiskFile(localDir: File, name: String): File = {
    val parent = new File(localDir, s"${KeyedStateConf.LocalSubdir}/jvm-x")
    parent.mkdirs()
    val link = new File(parent, name)
    Files.createSymbolicLink(link.toPath, new File("/dev/full").toPath)
    link
  }

  private def assertNamesDiskAndCause(e: Throwable, file: File, localDir: File): Unit = {
    assert(e.isInstanceOf[LocalDiskException], e)
    assert(e.asInstanceOf[LocalDiskException].errorId == "KEYEDSTATE_LOCAL_DISK_WRITE_FAILED", e)
    val message = e.getMessage
    assert(message.contains(file.toString), message)
    assert(message.contains("No space left on device"), message)
    assert(message.contains(s"keyedstate works under $localDir (${KeyedStateConf.Prefix}localDir"), message)
    assert(!message.contains("\n"), message)
  }

  test("a changelog that cannot be written names its file, the local directory and the reason") {
    assume(new File("/dev/full").exists(), "needs /dev/full")
    val localDir = tempDir()
    val file = fullDiskFile(localDir, "changelog-1.log")
    val log = new Changelog.Writer(file)
    // The first block (64 KB) that reaches the file fails, in the write that filled it.
    val e = intercept[IOException] {
      (0 until 100000).foreach(i => log.put("default", s"key-$i".getBytes, Array.fill(64)(i.toByte)))
    }
    assertNamesDiskAndCause(e, file, localDir)
    log.close() // discarding a log whose file cannot be written does not fail
    assert(!Files.exists(file.toPath, java.nio.file.LinkOption.NOFOLLOW_LINKS), "the log was not deleted")
  }

  test("a download onto a full local disk says so, instead of calling the checkpoint's file corrupt") {
    assume(new File("/dev/full").exists(), "needs /dev/full")
    val root = tempDir()
    val store = new CheckpointStore(new Path(root.getAbsolutePath), new Configuration())
    val source = new File(tempDir(), "000008.sst")
    Files.write(source.toPath, Array.fill(200000)(7.toByte))
    val entry: ManifestFile = store.upload(source, "000008.sst", "shared/000008-abc.sst")
    val localDir = tempDir()
    val target = fullDiskFile(localDir, "000008.sst")
    val e = intercept[IOException](store.download(entry, 3, target, verifyChecksum = true))
    assertNamesDiskAndCause(e, target, localDir)
    assert(e.getMessage.contains("shared/000008-abc.sst") && e.getMessage.contains("version 3"), e.getMessage)
    assert(!e.getMessage.contains("corrupt"), e.getMessage)
  }

  test("a commit whose changelog upload fails says why and leaves no changelog on the local disk") {
    val root = tempDir()
    val p = new KeyedStateStoreProvider
    p.init(StateStoreId(s"nochangelog://${root.getAbsolutePath}", 0, 0), keySchema, valueSchema,
      NoPrefixKeyStateEncoderSpec(keySchema), useColumnFamilies = false,
      storeConf(KeyedStateConf.Prefix + "localDir" -> tempDir().getAbsolutePath), ChangelogUploadFails.conf(), false,
      None)
    try {
      val workDir = new File(p.workingDbDir.getParentFile, "work")
      def localLogs: Seq[String] = Option(workDir.list()).toSeq.flatten.filter(_.startsWith("changelog-"))
      val s = p.getStore(0)
      (1 to 100).foreach(i => s.put(key(s"k$i"), value(i)))
      ChangelogUploadFails.failing = true
      val e = intercept[SparkException](s.commit())
      s.abort()
      assert(e.getCondition == "CANNOT_WRITE_STATE_STORE.CANNOT_COMMIT", e)
      val cause = e.getCause.getMessage
      assert(cause.contains("Cannot upload") && cause.contains("/changelog/1-"), cause)
      assert(cause.contains("upload refused by the test file system"), cause)
      assert(localLogs.isEmpty, s"left on the local disk: $localLogs")
      // The retry commits.
      ChangelogUploadFails.failing = false
      val retry = p.getStore(0)
      (1 to 100).foreach(i => retry.put(key(s"k$i"), value(i)))
      assert(retry.commit() == 1)
      assert(localLogs.isEmpty, s"left on the local disk: $localLogs")
    } finally {
      ChangelogUploadFails.failing = false
      p.close()
    }
  }

  test("a write that fails half-way (its changelog cannot be created) leaves the loaded version untouched") {
    val p = newProvider(tempDir(), storeConf(KeyedStateConf.Prefix + "localDir" -> tempDir().getAbsolutePath))
    try {
      val s = p.getStore(0)
      s.put(key("a"), value(1))
      assert(s.commit() == 1)
      // The first write of version 2 reaches RocksDB, then fails to create its changelog.
      val workDir = new File(p.workingDbDir.getParentFile, "work")
      io.keyedstate.checkpoint.LocalFiles.deleteRecursively(workDir)
      val failing = p.getStore(1)
      val e = intercept[IOException](failing.put(key("a"), value(99)))
      assert(e.isInstanceOf[LocalDiskException] && e.getMessage.contains(workDir.toString), e)
      failing.abort()
      workDir.mkdirs()
      // The next task on this executor gets version 1 as committed, not the failed write.
      val next = p.getStore(1)
      assert(contents(next) == Map(("a", 0) -> 1L))
      next.put(key("b"), value(2))
      assert(next.commit() == 2)
      val fresh = newProvider(new File(p.stateStoreId.checkpointRootLocation))
      try {
        val r = fresh.getReadStore(2)
        try assert(contents(r) == Map(("a", 0) -> 1L, ("b", 0) -> 2L)) finally r.release()
      } finally fresh.close()
    } finally p.close()
  }
}

/** A local file system on `nochangelog://` that refuses to create changelogs while `failing`. */
object ChangelogUploadFails {
  @volatile var failing = false

  def conf(): Configuration = TestFileSystems.conf("nochangelog", classOf[ChangelogUploadFails])
}

class ChangelogUploadFails extends RawLocalFileSystem {
  override def getUri: URI = URI.create("nochangelog:///")

  private def check(f: Path): Unit =
    if (ChangelogUploadFails.failing && f.toString.contains("/changelog/")) {
      throw new IOException(s"upload refused by the test file system: $f")
    }

  override def create(f: Path, permission: FsPermission, overwrite: Boolean, bufferSize: Int, replication: Short,
      blockSize: Long, progress: Progressable): FSDataOutputStream = {
    check(f)
    super.create(f, permission, overwrite, bufferSize, replication, blockSize, progress)
  }
  override def create(f: Path, overwrite: Boolean, bufferSize: Int, replication: Short, blockSize: Long,
      progress: Progressable): FSDataOutputStream = {
    check(f)
    super.create(f, overwrite, bufferSize, replication, blockSize, progress)
  }
}
