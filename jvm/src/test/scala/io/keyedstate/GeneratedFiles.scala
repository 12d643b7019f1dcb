package io.keyedstate

import java.nio.charset.StandardCharsets.UTF_8
import java.nio.file.{Files, Path, Paths}

import org.scalatest.Assertions

/**
 * Files generated from a declaration in the code and checked in (the Python package's option
 * and error catalogs, the docs' tables): a suite compares them with what the code generates now,
 * and rewrites them when `rewriteVariable` is 1.
 */
final class GeneratedFiles(rewriteVariable: String, regenerate: String) {
  val root: Path = Paths.get(sys.props.getOrElse("user.dir", "."))
  private val rewrite = sys.env.get(rewriteVariable).contains("1")

  private def read(path: Path): String = if (Files.exists(path)) new String(Files.readAllBytes(path), UTF_8) else ""

  /** The whole file is `generated`. */
  def file(relative: String, generated: String): Unit = compare(root.resolve(relative), read(root.resolve(relative)), generated)

  /** The part of the file between the markers `start` and `end` (included) is `generated`. */
  def section(relative: String, start: String, end: String, generated: String): Unit = {
    val path = root.resolve(relative)
    val text = read(path)
    val (from, to) = (text.indexOf(start), text.indexOf(end))
    Assertions.assert(from >= 0 && to > from, s"$path has no generated section markers ($start)")
    compare(path, text, text.substring(0, from) + generated + text.substring(to + end.length))
  }

  private def compare(path: Path, current: String, generated: String): Unit =
    if (rewrite) Files.write(path, generated.getBytes(UTF_8))
    else Assertions.assert(current == generated, s"$path is stale: run $rewriteVariable=1 $regenerate")
}
