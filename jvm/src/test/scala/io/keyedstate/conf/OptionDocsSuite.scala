package io.keyedstate.conf

import org.scalatest.funsuite.AnyFunSuite

import io.keyedstate.conf.{KeyedStateConf, OptionDocs}
import io.keyedstate.GeneratedFiles

/** The Python keywords and the docs' options table are generated from the option registry. */
class OptionDocsSuite extends AnyFunSuite {
  private val generated = new GeneratedFiles("KEYEDSTATE_WRITE_OPTION_DOCS",
    "./dev/sbt 'testOnly io.keyedstate.conf.OptionDocsSuite'")

  test("python/keyedstate/_options.json is generated from KeyedStateConf.options") {
    generated.file("python/keyedstate/_options.json", OptionDocs.json)
  }

  test("the options table of docs/configuration.md is generated from KeyedStateConf.options") {
    generated.section("docs/configuration.md", OptionDocs.TableStart, OptionDocs.TableEnd, OptionDocs.markdownTable)
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
