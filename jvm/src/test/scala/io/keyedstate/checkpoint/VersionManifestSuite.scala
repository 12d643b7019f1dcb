package io.keyedstate.checkpoint

import java.io.File
import java.nio.charset.StandardCharsets.UTF_8
import java.nio.file.Files
import java.util.zip.CRC32C

import scala.util.Try

import org.apache.hadoop.fs.Path
import org.scalatest.funsuite.AnyFunSuite

import io.keyedstate.{FaultyFileSystem, RenameReturnsFalseFileSystem, TestFileSystems}
import io.keyedstate.errors.CheckpointFileException

/**
 * The manifest protocol: a version exists exactly when its manifest does; names under checkpoint
 * format v1 and v2; a manifest appears whole or not at all (and a v1 retry replaces it whole); a
 * damaged, missing or misplaced manifest is reported with its path and version; every file a
 * manifest lists matches its recorded size and CRC32C.
 */
class VersionManifestSuite extends AnyFunSuite with CheckpointLayerFixture {

  private def manifest(version: Long, id: String = "c1", note: String = ""): VersionManifest =
    VersionManifest(VersionManifest.FormatVersion, version, id, Some("c0"), 1234L,
      Seq(ManifestColumnFamily("default", 3, "{}", "{}", note, multipleValues = false, internal = false)),
      version - 1, Seq(ManifestFile("000007.sst", s"shared/000007-$id.sst", 100, 42)),
      Seq(ChangelogFile(version, id, 3, ManifestFile("log", s"changelog/$version-$id.changelog", 10, 7))),
      Map("default" -> "00ff"))

  test("JSON round trip of a manifest and of a snapshot descriptor") {
    val m = manifest(5)
    assert(VersionManifest.fromJson(VersionManifest.toJson(m)) == m)
    val d = SnapshotDescriptor(4, "abc", m.files)
    assert(VersionManifest.descriptorFromJson(VersionManifest.toJson(d)) == d)
    assert(m.allFiles.map(_.path) == Seq("shared/000007-c1.sst", "changelog/5-c1.changelog"))
    assert(m.totalBytes == 110)
  }

  test("names: format v1 is <version>.manifest, format v2 <version>_<checkpoint id>.manifest") {
    val dir = tempDir()
    val store = storeAt(dir)
    store.ensureRoot()
    assert(CheckpointStore.manifestName(5, None) == "5.manifest")
    assert(CheckpointStore.manifestName(5, Some("c1")) == "5_c1.manifest")
    Seq("5.manifest" -> Some((5L, None)), "5_c1.manifest" -> Some((5L, Some("c1"))),
      "5_c1_x.manifest" -> Some((5L, Some("c1_x"))), ".5.manifest" -> None, "x.manifest" -> None,
      "5.snapshot" -> None, "5.manifest.tmp" -> None).foreach { case (name, parsed) =>
      assert(CheckpointStore.parseManifestName(name) == parsed, name)
    }
    store.writeManifest(manifest(5, "c1"), checkpointIdsEnabled = false)
    store.writeManifest(manifest(5, "c2"), checkpointIdsEnabled = true)
    store.writeManifest(manifest(5, "c3"), checkpointIdsEnabled = true)
    assert(dir.list().filter(_.endsWith(".manifest")).toSet == Set("5.manifest", "5_c2.manifest", "5_c3.manifest"))
    // Under v2 two attempts at one version are two manifests, each read by its id.
    assert(store.readManifest(5, Some("c2")).checkpointId == "c2")
    assert(store.readManifest(5, Some("c3")).checkpointId == "c3")
    assert(store.readManifest(5, None).checkpointId == "c1")
  }

  test("publish is atomic on the local file system: no temporary file left, a v1 retry replaces the manifest whole") {
    val dir = tempDir()
    val store = storeAt(dir)
    store.ensureRoot()
    store.writeManifest(manifest(5, "first"), checkpointIdsEnabled = false)
    store.writeManifest(manifest(5, "second", note = "x" * 100000), checkpointIdsEnabled = false)
    assert(store.readManifest(5, None) == manifest(5, "second", note = "x" * 100000))
    assert(dir.list().toSet == Set("5.manifest"), dir.list().toSeq)
    assert(store.listTemporaryFiles().isEmpty)
  }

  test("a publish whose rename the file system refuses fails naming the manifest and the version; the old one stays") {
    val dir = tempDir()
    storeAt(dir).writeManifest(manifest(5, "first"), checkpointIdsEnabled = false)
    val conf = TestFileSystems.conf("renamefails", classOf[RenameReturnsFalseFileSystem])
    val store = new CheckpointStore(new Path(s"renamefails://${dir.getAbsolutePath}"), conf)
    val e = intercept[Exception](store.writeManifest(manifest(5, "second"), checkpointIdsEnabled = false))
    assert(messages(e).contains("5.manifest") && messages(e).contains("version 5"), messages(e))
    assert(storeAt(dir).readManifest(5, None).checkpointId == "first")
    val e6 = intercept[Exception](store.writeManifest(manifest(6), checkpointIdsEnabled = false))
    assert(messages(e6).contains("6.manifest"), messages(e6))
    assert(!new File(dir, "6.manifest").exists(), "a failed publish must not leave the version visible")
  }

  test("a fault at every file-system call of a manifest publish: the old manifest or the new one, whole; the error names it") {
    val dir = tempDir()
    storeAt(dir).writeManifest(manifest(5, "old"), checkpointIdsEnabled = false)
    val conf = TestFileSystems.conf("faulty", classOf[FaultyFileSystem])
    val store = new CheckpointStore(new Path(s"faulty://${dir.getAbsolutePath}"), conf)
    FaultyFileSystem.countOnly()
    store.writeManifest(manifest(5, "counted"), checkpointIdsEnabled = false)
    val calls = FaultyFileSystem.disarm()
    storeAt(dir).writeManifest(manifest(5, "old"), checkpointIdsEnabled = false)
    // Each call failed twice: with an IOException, and with an unchecked one that names no path
    // (an object store's client): the failure names the manifest and the version either way.
    val tried = for (n <- 1 to calls.toInt; unchecked <- Seq(false, true)) yield {
      FaultyFileSystem.armAt(n, unchecked)
      val attempt = Try(store.writeManifest(manifest(5, s"new$n"), checkpointIdsEnabled = false))
      val ok = attempt.isSuccess
      val failed = FaultyFileSystem.failedCall
      FaultyFileSystem.disarm()
      assert(failed.isDefined, s"call $n of $calls was not made")
      attempt.failed.foreach { e =>
        assert(e.isInstanceOf[CheckpointFileException] && e.getMessage.contains(dir.getAbsolutePath) &&
          e.getMessage.contains("version 5"), s"fault at ${failed.get} (unchecked: $unchecked): $e")
      }
      val id = storeAt(dir).readManifest(5, None).checkpointId
      assert(if (ok) id == s"new$n" else id == "old" || id == s"new$n", s"fault at ${failed.get}: manifest of $id")
      storeAt(dir).writeManifest(manifest(5, "old"), checkpointIdsEnabled = false)
      failed.get
    }
    info(s"${tried.size} injection points: ${tried.mkString(", ")}")
    assert(tried.size == calls * 2 && calls >= 2)
  }

  test("a missing, truncated, misplaced or unsupported manifest is reported with its path and version") {
    val dir = tempDir()
    val store = storeAt(dir)
    store.writeManifest(manifest(3), checkpointIdsEnabled = false)

    val missing = intercept[CheckpointFileException](store.readManifest(4, None))
    assert(missing.getMessage == "[KEYEDSTATE_CHECKPOINT_FILE_MISSING] State version 4 is missing: manifest " +
      s"${store.manifestPath(4, None)} does not exist")

    Files.copy(new File(dir, "3.manifest").toPath, new File(dir, "4.manifest").toPath)
    val misplaced = intercept[CheckpointFileException](store.readManifest(4, None))
    assert(misplaced.getMessage.contains("4.manifest describes version 3, expected version 4"), misplaced.getMessage)

    truncate(new File(dir, "3.manifest"), 40)
    val corrupt = intercept[CheckpointFileException](store.readManifest(3, None))
    assert(corrupt.getMessage.contains("State version 3 has a corrupt manifest") &&
      corrupt.getMessage.contains(s"${store.manifestPath(3, None)} (40 bytes)"), corrupt.getMessage)

    val old = VersionManifest.toJson(manifest(5))
      .replace(s"\"formatVersion\" : ${VersionManifest.FormatVersion}", "\"formatVersion\" : 2")
    assert(old.contains("\"formatVersion\" : 2"), "the test must really write format 2")
    Files.write(new File(dir, "5.manifest").toPath, old.getBytes(UTF_8))
    val unsupported = intercept[CheckpointFileException](store.readManifest(5, None))
    assert(unsupported.getMessage.contains("5.manifest") && unsupported.getMessage.contains("version 5") &&
      unsupported.getMessage.contains("unsupported manifest format version 2"), unsupported.getMessage)
  }

  for (changelog <- Seq(false, true)) {
    test(s"every file a committed manifest lists has the recorded size and CRC32C (changelog=$changelog)") {
      val store = storeAt(tempDir())
      val w = new LayerWriter(store, layerConf(changelog = changelog), snapshotInterval = 2)
      try w.commitSome(5) finally w.close()
      val manifests = (1L to 5L).map(v => store.readManifest(v, None))
      assert(manifests.map(_.version) == (1L to 5L))
      manifests.flatMap(_.allFiles).distinct.foreach { f =>
        val bytes = Files.readAllBytes(fileOf(store, f).toPath)
        val crc = new CRC32C()
        crc.update(bytes)
        assert(bytes.length == f.size && crc.getValue == f.crc32c, f)
      }
      // Each version is built on the commit before it.
      manifests.sliding(2).foreach { case Seq(a, b) => assert(b.baseCheckpointId.contains(a.checkpointId)) }
      if (changelog) assert(manifests.exists(_.changelogs.nonEmpty) && manifests.exists(_.snapshotVersion > 0))
      else assert(manifests.forall(m => m.changelogs.isEmpty && m.snapshotVersion == m.version))
    }
  }

  test("a snapshot descriptor rebases a manifest only when it is of the manifest's own history") {
    val m = manifest(5).copy(snapshotVersion = 2, changelogs = (3L to 5L).map(v =>
      ChangelogFile(v, s"c$v", 1, ManifestFile("log", s"changelog/$v-c$v.changelog", 1, 1))))
    val files = Seq(ManifestFile("000009.sst", "shared/000009-c4.sst", 5, 5))
    assert(m.hasInLineage(SnapshotDescriptor(4, "c4", files)))
    assert(!m.hasInLineage(SnapshotDescriptor(4, "other-attempt", files)))
    assert(!m.hasInLineage(SnapshotDescriptor(2, "c2", files)), "not newer than the base")
    assert(!m.hasInLineage(SnapshotDescriptor(6, "c6", files)), "newer than the version")
    val rebased = m.rebasedOn(SnapshotDescriptor(4, "c4", files))
    assert(rebased.snapshotVersion == 4 && rebased.files == files && rebased.changelogs.map(_.version) == Seq(5L))
    assert(m.copy(checkpointId = "c5").hasInLineage(SnapshotDescriptor(5, "c5", files)))
  }
}
