package io.keyedstate

import java.nio.charset.StandardCharsets.UTF_8
import java.nio.file.{Files, Path, Paths}

import org.scalatest.funsuite.AnyFunSuite

import io.keyedstate.conf.{KeyedStateConf, OptionDocs}

/** The Python keywords and the docs' options table are generated from the option registry. */
class OptionDocsSuite extends AnyFunSuite {
  private val root = Paths.get(sys.props.getOrElse("user.dir", "."))
  private val pythonOptions = root.resolve("python/keyedstate/_options.json")
  private val docs = root.resolve("docs/configuration.md")
  private val rewrite = sys.env.get("KEYEDSTATE_WRITE_OPTION_DOCS").contains("1")

  private def read(path: Path): String = new String(Files.readAllBytes(path), UTF_8)

  private def check(path: Path, current: String, generated: String): Unit =
    if (rewrite) Files.write(path, generated.getBytes(UTF_8))
    else assert(current == generated,
      s"$path is stale: run KEYEDSTATE_WRITE_OPTION_DOCS=1 ./dev/sbt 'testOnly io.keyedstate.OptionDocsSuite'")

  test("python/keyedstate/_options.json is generated from KeyedStateConf.options") {
    check(pythonOptions, if (Files.exists(pythonOptions)) read(pythonOptions) else "", OptionDocs.json)
  }

  test("the options table of docs/configuration.md is generated from KeyedStateConf.options") {
    val text = read(docs)
    val start = text.indexOf(OptionDocs.TableStart)
    val end = text.indexOf(OptionDocs.TableEnd)
    assert(start >= 0 && end > start, s"$docs has no generated options table markers")
    val updated = text.substring(0, start) + OptionDocs.markdownTable + text.substring(end + OptionDocs.TableEnd.length)
    check(docs, text, updated)
  }

  test("every option parses its default and refuses a bad value naming key, value and allowed") {
    KeyedStateConf.options.foreach { o =>
      val e = intercept[IllegalArgumentException](KeyedStateConf.fromMap(Map(o.key -> "not-a-value!")))
      assert(e.getMessage.contains(o.key) && e.getMessage.contains("not-a-value!") && e.getMessage.contains(o.allowed))
    }
    assert(KeyedStateConf.fromMap(Map.empty).compression == "zstd")
    assert(KeyedStateConf.fromMap(Map.empty).changelogCompression == "zstd")
  }
}
