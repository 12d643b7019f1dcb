package io.keyedstate.checkpoint

import java.io.File
import java.nio.file.Files
import java.util.zip.CRC32C

import org.apache.hadoop.conf.Configuration
import org.scalatest.funsuite.AnyFunSuite

import io.keyedstate.TestFileSystems
import io.keyedstate.errors.CheckpointFileException

/**
 * The checkpoint store on its own, on Hadoop's local file system: uploads and downloads with
 * their size and CRC32C, the directory layout and its listings, deletes. The manifest protocol
 * is [[VersionManifestSuite]].
 */
class CheckpointStoreSuite extends AnyFunSuite with CheckpointLayerFixture {

  private def localFile(bytes: Array[Byte]): File = {
    val f = new File(tempDir(), "local.bin")
    Files.write(f.toPath, bytes)
    f
  }

  private def crcOf(bytes: Array[Byte]): Long = { val c = new CRC32C(); c.update(bytes); c.getValue }

  private val payload: Array[Byte] = Array.tabulate(300000)(i => (i * 31 + i / 7).toByte)

  test("an upload records the bytes written and their CRC32C; a download gives the same bytes back") {
    val store = storeAt(tempDir())
    val entry = store.upload(localFile(payload), "000012.sst", "shared/000012-abc.sst")
    assert(entry == ManifestFile("000012.sst", "shared/000012-abc.sst", payload.length, crcOf(payload)))
    assert(Files.readAllBytes(fileOf(store, entry).toPath).sameElements(payload))
    val back = new File(tempDir(), "back.sst")
    assert(store.download(entry, 7, back, verifyChecksum = true) == payload.length)
    assert(Files.readAllBytes(back.toPath).sameElements(payload))
    // No checksum side files: every file carries its CRC32C in the manifest instead.
    assert(store.listDataFiles().map(_._1) == Seq("shared/000012-abc.sst"))
    assert(!new File(fileOf(store, entry).getParentFile, ".000012-abc.sst.crc").exists())
  }

  test("local files get the mode Hadoop would give them (fs.permissions.umask-mode), not the process umask") {
    import scala.jdk.CollectionConverters._
    def modeOf(f: File): String =
      java.nio.file.attribute.PosixFilePermissions.toString(Files.getPosixFilePermissions(f.toPath))
    val default = storeAt(tempDir())
    assert(modeOf(fileOf(default, default.upload(localFile(payload), "1.sst", "shared/1-a.sst"))) == "rw-r--r--")
    val conf = new Configuration()
    conf.set("fs.permissions.umask-mode", "077")
    val strict = storeAt(tempDir(), conf)
    assert(modeOf(fileOf(strict, strict.upload(localFile(payload), "1.sst", "shared/1-a.sst"))) == "rw-------")
    val writer = new LayerWriter(strict, layerConf())
    try writer.commit(Map("k" -> "v")) finally writer.close()
    val written = Files.walk(new File(strict.root.toUri.getPath).toPath).iterator().asScala.map(_.toFile)
      .filter(_.isFile).toSeq
    assert(written.exists(_.getName.endsWith(".manifest")) && written.exists(_.getName.endsWith(".changelog")))
    assert(written.forall(f => modeOf(f) == "rw-------"), written.map(f => f.getName -> modeOf(f)))
  }

  test("an upload never replaces a durable file: names are unique per commit") {
    val store = storeAt(tempDir())
    store.upload(localFile(payload), "000012.sst", "shared/000012-abc.sst")
    val e = intercept[CheckpointFileException](
      store.upload(localFile(Array[Byte](1, 2, 3)), "000012.sst", "shared/000012-abc.sst"))
    assert(e.getMessage.contains("shared/000012-abc.sst"), e.getMessage)
    assert(Files.readAllBytes(new File(store.root.toUri.getPath, "shared/000012-abc.sst").toPath).sameElements(payload))
  }

  test("a missing, truncated or altered file fails the download, naming the file and the version") {
    val store = storeAt(tempDir())
    val entry = store.upload(localFile(payload), "000012.sst", "shared/000012-abc.sst")
    val target = new File(tempDir(), "t.sst")
    val durable = fileOf(store, entry)

    flipByte(durable, 1000)
    val corrupt = intercept[CheckpointFileException](store.download(entry, 7, target, verifyChecksum = true))
    assert(corrupt.getMessage.contains("000012-abc.sst") && corrupt.getMessage.contains("version 7") &&
      corrupt.getMessage.contains("CRC32C"), corrupt.getMessage)
    // Without the checksum check an altered file of the right size is not caught: the option's cost.
    assert(store.download(entry, 7, target, verifyChecksum = false) == payload.length)

    truncate(durable, 1000)
    val damaged = intercept[CheckpointFileException](store.download(entry, 7, target, verifyChecksum = false))
    assert(damaged.getMessage.contains("000012-abc.sst") && damaged.getMessage.contains("version 7") &&
      damaged.getMessage.contains(s"1000 bytes, the manifest says ${payload.length}"), damaged.getMessage)

    assert(durable.delete())
    val missing = intercept[CheckpointFileException](store.download(entry, 7, target, verifyChecksum = true))
    assert(missing.getMessage.contains("000012-abc.sst") && missing.getMessage.contains("version 7") &&
      missing.getMessage.contains("missing"), missing.getMessage)
  }

  test("listings: data files by directory, manifests and descriptors by name, temporary files apart") {
    val dir = tempDir()
    val store = storeAt(dir)
    val one = localFile(Array[Byte](1))
    Seq("shared/000001-a.sst", "private/3-a-CURRENT", "changelog/3-a.changelog").foreach(p => store.upload(one, "x", p))
    Seq("3.manifest", "10.manifest", "3_abc.manifest", "4_def.snapshot", "notes.manifest", "5.snapshot",
      ".3.manifest.1234.tmp", ".hidden.manifest", "_metadata").foreach(n => Files.write(new File(dir, n).toPath, Array[Byte](1)))
    Files.write(new File(dir, "shared/.000001-a.sst.crc").toPath, Array[Byte](1))

    assert(store.listDataFiles().map(_._1).toSet ==
      Set("shared/000001-a.sst", "private/3-a-CURRENT", "changelog/3-a.changelog"))
    // Format v1 (`<version>.manifest`) and v2 (`<version>_<id>.manifest`) names; others ignored.
    assert(store.listManifests().map(m => (m.version, m.checkpointId)).toSet == Set((3L, None), (3L, Some("abc")), (10L, None)))
    assert(store.listManifests().map(_.version) == Seq(3L, 3L, 10L))
    // A descriptor without a commit id is not one of ours.
    assert(store.listSnapshotDescriptors().map(d => (d.version, d.checkpointId)) == Seq((4L, Some("def"))))
    assert(store.listTemporaryFiles().map(_._1) == Seq(".3.manifest.1234.tmp"))
  }

  test("listing a store that does not exist yet is empty; ensureRoot creates it") {
    val dir = new File(tempDir(), "state/0/4")
    val store = storeAt(dir)
    assert(store.listManifests().isEmpty && store.listDataFiles().isEmpty && store.listTemporaryFiles().isEmpty)
    store.ensureRoot()
    assert(dir.isDirectory)
    store.ensureRoot() // idempotent
  }

  test("delete: a missing file is not an error; a file the file system refuses to delete stays") {
    val dir = tempDir()
    val store = storeAt(dir)
    store.delete(store.resolve("shared/never-written.sst"))
    val f = new File(dir, "shared/000001-a.sst")
    store.upload(localFile(Array[Byte](1)), "000001.sst", "shared/000001-a.sst")

    val refusing = TestFileSystems.conf("refusing", classOf[RefusingFileSystem])
    val viaRefusing = new CheckpointStore(new org.apache.hadoop.fs.Path(s"refusing://${dir.getAbsolutePath}"), refusing)
    RefusingFileSystem.refuseDeletes = true
    try viaRefusing.delete(viaRefusing.resolve("shared/000001-a.sst"))
    finally RefusingFileSystem.refuseDeletes = false
    assert(f.exists(), "a refused delete must not be taken for done")
    store.delete(store.resolve("shared/000001-a.sst"))
    assert(!f.exists())
  }
}

/** A local file system on `refusing://` whose delete reports failure (returns false) when asked. */
class RefusingFileSystem extends org.apache.hadoop.fs.RawLocalFileSystem {
  override def getUri: java.net.URI = java.net.URI.create("refusing:///")
  override def delete(p: org.apache.hadoop.fs.Path, recursive: Boolean): Boolean =
    if (RefusingFileSystem.refuseDeletes) false else super.delete(p, recursive)
}

object RefusingFileSystem {
  @volatile var refuseDeletes = false
}
