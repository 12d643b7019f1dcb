package io.keyedstate.errors

import org.scalatest.funsuite.AnyFunSuite

import io.keyedstate.GeneratedFiles

/**
 * The errors are declared once ([[ErrorId]]): the identifiers are stable names, every one is
 * listed, and the Python module and the docs' table generated from them are current.
 */
class ErrorCatalogSuite extends AnyFunSuite {
  private val generated = new GeneratedFiles("KEYEDSTATE_WRITE_ERROR_DOCS",
    "./dev/sbt 'testOnly io.keyedstate.errors.ErrorCatalogSuite'")

  /** Every identifier and family declared, found by reflection: a new one left out of `all` fails. */
  private def declared[T](holder: AnyRef, of: Class[T]): Set[T] =
    // Scala lists a companion object's nested objects under the companion class.
    (holder.getClass.getDeclaredClasses ++ of.getDeclaredClasses).toSet.filter(c => of.isAssignableFrom(c) && c != of)
      .map(c => of.cast(c.getField("MODULE$").get(null)))

  test("every declared identifier and family is listed once; identifiers are upper snake case and found by name") {
    assert(ErrorId.all.toSet == declared(ErrorId, classOf[ErrorId]))
    assert(ErrorFamily.all.toSet == declared(ErrorFamily, classOf[ErrorFamily]))
    val names = ErrorId.all.map(_.name)
    assert(names.distinct.size == names.size, names)
    names.foreach { n =>
      assert(n.matches("(KEYEDSTATE|KEYED_FUNCTION)_[A-Z_]+"), n)
      assert(ErrorId.named(n).map(_.name).contains(n), n)
    }
    assert(ErrorFamily.all.map(_.pythonClass).distinct.size == ErrorFamily.all.size)
    assert(ErrorId.all.map(_.family).toSet == ErrorFamily.all.toSet, "a family without identifiers")
  }

  test("python/keyedstate/_error_catalog.py is generated from the declaration") {
    generated.file("python/keyedstate/_error_catalog.py", ErrorCatalog.python)
  }

  test("the identifiers table of docs/errors.md is generated from the declaration") {
    generated.section("docs/errors.md", ErrorCatalog.TableStart, ErrorCatalog.TableEnd, ErrorCatalog.markdownTable)
  }

  test("a keyedstate error carries its identifier in its message, and is found under wrappers") {
    val ours = new KeyedStateIOException(ErrorId.CheckpointFileMissing, "State file f needed by version 3 is missing")
    assert(ours.getMessage == "[KEYEDSTATE_CHECKPOINT_FILE_MISSING] State file f needed by version 3 is missing")
    assert(ours.errorId == "KEYEDSTATE_CHECKPOINT_FILE_MISSING")
    val wrapped = new RuntimeException("job aborted", new IllegalStateException("task failed", ours))
    assert(KeyedStateError.find(wrapped).contains(ours))
    assert(KeyedStateError.find(new RuntimeException("other")).isEmpty)
    assert(KeyedStateError.detailOf(ours) == "State file f needed by version 3 is missing")
  }
}
