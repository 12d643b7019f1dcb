package io.keyedstate.errors

import org.scalatest.funsuite.AnyFunSuite

/** The identifiers are stable names: unique, in the documented form, each with its family. */
class ErrorIdSuite extends AnyFunSuite {
  test("identifiers are unique, upper snake case, prefixed, and found by name") {
    val names = ErrorId.all.map(_.name)
    assert(names.distinct.size == names.size, names)
    names.foreach { n =>
      assert(n.matches("(KEYEDSTATE|KEYED_FUNCTION)_[A-Z_]+"), n)
      assert(ErrorId.named(n).map(_.name).contains(n), n)
    }
    assert(ErrorId.all.map(_.family).toSet.size == 8)
  }

  test("every identifier is documented in docs/errors.md") {
    val doc = scala.io.Source.fromFile("docs/errors.md")
    val text = try doc.mkString finally doc.close()
    ErrorId.all.foreach(id => assert(text.contains(s"| `${id.name}` |"), s"${id.name} is not in docs/errors.md"))
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
