"""The code is laid out by layer, lowest first: a module imports its own package and lower
layers, never another package of its layer or a higher one (Python and the JVM alike); the
package root (``keyedstate/__init__.py``) is the lazy facade that re-exports every layer, imports
none of them until a name is used, and only the tools use it from inside."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import PYTHON_SOURCES, REPO, makefile_words

PACKAGE = PYTHON_SOURCES / "keyedstate"

# The Python side, lowest layer first: each entry a top-level module or subpackage of keyedstate.
PY_LAYERS = [
    {"_error_catalog", "_version"},  # generated from the JVM's error declaration; the version
    {"errors"},
    {"_session"},  # the session's configuration and the jar
    {"state"},  # the state API (PyFlink's datastream/state.py): imports no runtime code
    {"functions", "elements"},
    {"keyed_stream"},
    {"spark_connect"},  # keyedstate's relations on Spark Connect (PySpark's Connect client)
    {"engine", "offline", "runtime", "sinks"},
    {"service"},  # the query service's client: savepoints through the query's application
    {"tools", "examples"},
]
# Upward imports allowed inside a function only, run when used (never at import time).
PY_LAZY_UPWARD = {
    ("keyed_stream", "engine"),  # a keyed stream plans itself with the engine when it is run
    ("state", "offline"),  # keyedstate.state.read/bootstrap/transform, the state processor API
}
# Who may import the package root (the facade) from inside the package.
PY_FACADE_USERS = {"tools", "examples"}


def package_of(path: Path) -> str:
    """The top-level module or subpackage of keyedstate a file belongs to ("" for the root)."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return parts[0] if parts else ""


def runs_on_import(tree: ast.Module) -> set[int]:
    """The nodes of a module that run when it is imported: all but those inside functions and
    ``if TYPE_CHECKING:`` blocks."""
    running: set[int] = set()

    def visit(node: ast.AST) -> None:
        running.add(id(node))
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                continue
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for other in child.orelse:
                    visit(other)
                continue
            visit(child)

    visit(tree)
    return running


def imported_packages(path: Path) -> list[tuple[str, bool, int]]:
    """(top-level module or subpackage of keyedstate, imported when the module is imported,
    line) of every keyedstate import of a file, those inside functions and ``TYPE_CHECKING``
    blocks included ("" for the root itself)."""
    tree = ast.parse(path.read_text())
    top_level = runs_on_import(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level > 0:
            found.append(("<relative>", id(node) in top_level, node.lineno))
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = node.module.split(".")
            if names[0] != "keyedstate":
                continue
            if len(names) > 1:
                found.append((names[1], id(node) in top_level, node.lineno))
            else:  # from keyedstate import x: a submodule, or a name of the facade
                for alias in node.names:
                    sub = (PACKAGE / alias.name).is_dir() or (PACKAGE / f"{alias.name}.py").exists()
                    found.append((alias.name if sub else "", id(node) in top_level, node.lineno))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                names = alias.name.split(".")
                if names[0] == "keyedstate":
                    found.append(
                        (names[1] if len(names) > 1 else "", id(node) in top_level, node.lineno)
                    )
    return found


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` run by a fresh interpreter importing this checkout's keyedstate."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(PACKAGE.parent), *filter(None, [env.get("PYTHONPATH")])]
    )
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, env=env
    )


def test_python_modules_import_only_their_own_or_lower_layers() -> None:
    rank = {name: i for i, layer in enumerate(PY_LAYERS) for name in layer}
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        package = package_of(path)
        if package == "":
            # The facade: every import lazy (in a function or for type checkers only).
            problems += [
                f"{path.relative_to(PACKAGE)}:{line} imports keyedstate.{imported} on import"
                for imported, top, line in imported_packages(path)
                if top
            ]
            continue
        assert package in rank, f"{path.relative_to(PACKAGE)}: {package!r} has no layer"
        for imported, top, line in imported_packages(path):
            where = f"{path.relative_to(PACKAGE)}:{line} ({package})"
            if imported == package:
                continue
            if imported == "<relative>":
                problems.append(f"{where} imports relatively: name the keyedstate module")
                continue
            if imported == "":
                if package not in PY_FACADE_USERS:
                    problems.append(f"{where} imports the package root")
                continue
            assert imported in rank, f"{where} imports keyedstate.{imported}, which has no layer"
            lazy = (package, imported) in PY_LAZY_UPWARD and not top
            if rank[imported] >= rank[package] and not lazy:
                problems.append(f"{where} imports keyedstate.{imported}")
    assert not problems, "\n".join(problems)


def test_importing_the_package_loads_no_engine_and_every_module_imports_alone() -> None:
    modules = sorted(
        "keyedstate." + str(p.relative_to(PACKAGE).with_suffix("")).replace("/", ".")
        for p in PACKAGE.rglob("*.py")
        if p.name != "__init__.py"
    )
    code = (
        "import sys, importlib\n"
        "import keyedstate\n"
        "engine = [m for m in sys.modules if m.startswith('keyedstate.engine')]\n"
        "assert not engine, engine\n"
        f"for name in {modules!r}:\n"
        "    for m in [m for m in sys.modules if m.startswith('keyedstate')]:\n"
        "        del sys.modules[m]\n"
        "    importlib.import_module(name)\n"
        "print('ok')\n"
    )
    done = run_python(code)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-2000:]


TESTS = REPO / "tests"
# Folders of Python files that are not modules: scripts tests run as their own processes.
TEST_SCRIPT_FOLDERS = {TESTS / "support" / "drivers"}


def test_tests_are_laid_out_by_layer() -> None:
    """The tests are laid out like the code (docs/testing.md): each test module in a layer's
    folder, none at the top of tests/; every folder of modules a package (imported by full name,
    so two folders may hold modules of one name); tests/support imports no test module."""
    problems = [f"tests/{p.name} is not in a layer's folder" for p in TESTS.glob("test_*.py")]
    for folder in sorted({p.parent for p in TESTS.rglob("*.py")} - TEST_SCRIPT_FOLDERS):
        if not (folder / "__init__.py").exists():
            problems.append(f"{folder.relative_to(REPO)} has no __init__.py")
    for path in sorted((TESTS / "support").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            problems += [
                f"{path.relative_to(REPO)}:{node.lineno} imports {name}"
                for name in names
                if name.split(".")[0] == "tests" and name.split(".")[1:2] != ["support"]
            ]
    assert not problems, "\n".join(problems)


# What the state API and the errors must load without: the layers that run queries or jobs.
PY_RUNTIME_LAYERS = ("offline", "runtime", "sinks", "engine")


@pytest.mark.parametrize("module", ["keyedstate", "keyedstate.errors", "keyedstate.state"])
def test_the_facade_errors_and_state_api_import_no_runtime_layer(module: str) -> None:
    done = run_python(
        f"import {module}, sys; print(sorted(m for m in sys.modules if m.startswith('keyedstate')))"
    )
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = ast.literal_eval(done.stdout.strip().splitlines()[-1])
    assert module in loaded
    runtime = [m for m in loaded if m.split(".")[1:2] and m.split(".")[1] in PY_RUNTIME_LAYERS]
    assert not runtime, f"import {module} loaded {runtime}"


def test_every_name_of_the_facade_resolves_to_the_object_it_names() -> None:
    """Each name in ``keyedstate.__all__`` (and ``dir(keyedstate)``) resolves in a fresh
    interpreter, to the object of the module its ``TYPE_CHECKING`` import names: the type
    checkers' view and the runtime's are the same names."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    declared = {
        alias.name: node.module
        for block in tree.body
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for node in block.body
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    code = (
        "import importlib, keyedstate\n"
        f"declared = {declared!r}\n"
        "assert sorted(keyedstate.__all__) == sorted(declared), "
        "set(keyedstate.__all__) ^ set(declared)\n"
        "for name in keyedstate.__all__:\n"
        "    value = getattr(keyedstate, name)\n"
        "    assert value is getattr(importlib.import_module(declared[name]), name), name\n"
        "for name in dir(keyedstate):\n"
        "    getattr(keyedstate, name)\n"
        "print('ok', len(keyedstate.__all__))\n"
    )
    done = run_python(code)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-2000:]


# The JVM side, lowest layer first (docs/architecture.md, "Code layout"): a package may import
# itself and lower layers' packages, never another of its layer or a higher one. "" is the
# provider itself.
JVM_ROOT = PACKAGE.parent.parent / "jvm" / "src" / "main" / "scala" / "io" / "keyedstate"
JVM_LAYERS = [
    {"errors"},
    # What differs between Spark versions (one folder per version, jvm/src/main/scala-spark-*/).
    {"shims"},
    {"conf"},
    {"rocks"},
    {"checkpoint"},
    {"checkpoint.commit", "checkpoint.retention", "ttl"},
    {"checkpoint.restore"},
    {"metrics"},
    {""},
    {"engine"},
    # The offline operations on a query's checkpoint: one reader and one writer of it in
    # ``offline``, each operation in a package of its own above them.
    {"offline"},
    {"offline.inspect", "offline.rescale"},
    {"offline.savepoint"},
    # Queryable state: the executors' state servers, the driver's proxy and its catalog.
    {"queryable"},
    # The query service on the driver, over the running queries and the offline operations.
    {"service"},
    # Spark Connect's plugins: keyedstate's relations planned as py4j's entry points plan them.
    {"sparkconnect"},
]
# Outside the layers: packages that import no other keyedstate package but the error
# identifiers, and that only the packages named here import (the Kafka sink's writer needs
# nothing of the store; Spark Connect's operations call it for a Connect client's foreachBatch).
JVM_STANDALONE = {"sinks": {"sparkconnect"}}
# The lowest layer, which imports no other keyedstate package: the standalone ones may use it.
JVM_SHARED = {"errors"}


# Each Spark version's shims: jvm/src/main/scala-spark-<minor>/io/keyedstate/ (and <from>+/).
JVM_VERSION_ROOTS = sorted(JVM_ROOT.parent.parent.parent.glob("scala-spark-*/io/keyedstate"))


def jvm_root_of(path: Path) -> Path:
    return next(root for root in [JVM_ROOT, *JVM_VERSION_ROOTS] if path.is_relative_to(root))


def jvm_package(path: Path) -> str:
    """``checkpoint.commit`` for .../io/keyedstate/checkpoint/commit/X.scala; "" at the root."""
    root = jvm_root_of(path)
    relative = path.parent.relative_to(root)
    return "" if path.parent == root else str(relative).replace("/", ".")


def test_jvm_packages_import_only_their_own_or_lower_layers() -> None:
    rank = {package: i for i, layer in enumerate(JVM_LAYERS) for package in layer}
    problems = []
    sources = sorted(JVM_ROOT.rglob("*.scala"))
    assert len(sources) > 30, f"the provider's sources are not under {JVM_ROOT}"
    assert JVM_VERSION_ROOTS, "no Spark version's shims under jvm/src/main/scala-spark-*"
    sources += [path for root in JVM_VERSION_ROOTS for path in sorted(root.rglob("*.scala"))]
    for path in sources:
        package = jvm_package(path)
        assert package in rank or package in JVM_STANDALONE, (
            f"{path}: package {package!r} has no layer"
        )
        for line in path.read_text().splitlines():
            found = re.match(r"import io\.keyedstate\.([\w.]*?)\.?(?:[A-Z{_]|$)", line)
            if not found:
                continue
            imported = found.group(1)
            if imported == package:
                continue
            if imported in JVM_SHARED and rank[imported] < rank.get(package, len(rank)):
                continue
            assert imported in rank or imported in JVM_STANDALONE, (
                f"{path} imports io.keyedstate.{imported}, which has no layer"
            )
            if imported in JVM_STANDALONE and package in JVM_STANDALONE[imported]:
                continue
            if (
                package in JVM_STANDALONE
                or imported in JVM_STANDALONE
                or rank[imported] >= rank[package]
            ):
                problems.append(f"{path} ({package or 'provider'}): {line}")
    assert not problems, "\n".join(problems)


def test_architecture_doc_lists_every_jvm_source_file() -> None:
    """docs/architecture.md's file table names every Scala source file, and only those: a cell
    names a file by its path under ``io/keyedstate/`` (or from ``org/``), the files after it in
    the same cell by name in the same folder."""
    doc = (PACKAGE.parent.parent / "docs" / "architecture.md").read_text()
    listed = set()
    for line in doc.splitlines():
        if not line.startswith("| `"):
            continue
        folder = ""
        for name in re.findall(r"`([\w/.]+\.scala)`", line.split("|")[1]):
            if "/" in name:
                folder = name.rsplit("/", 1)[0]
                listed.add(name)
            else:
                listed.add(f"{folder}/{name}" if folder else name)
    main = JVM_ROOT.parent.parent  # jvm/src/main/scala
    actual = {str(p.relative_to(JVM_ROOT)) for p in JVM_ROOT.rglob("*.scala")}
    actual |= {str(p.relative_to(main)) for p in (main / "org").rglob("*.scala")}
    assert not actual - listed, f"not in architecture.md's file table: {sorted(actual - listed)}"
    stale = sorted(listed - actual)
    assert not stale, f"architecture.md names files that do not exist: {stale}"


def test_the_package_its_jar_and_the_build_have_one_version() -> None:
    """A Spark Connect server refuses a client of another keyedstate version by the jar's
    manifest: the Python package (its facade and keyedstate._version), pyproject.toml, build.sbt
    and the built jar must agree."""
    import zipfile

    from keyedstate._session import jar_path
    from keyedstate._version import __version__

    pyproject = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M)
    sbt = re.search(r'^ThisBuild / version := "([^"]+)"', (REPO / "build.sbt").read_text(), re.M)
    with zipfile.ZipFile(jar_path()) as jar:
        manifest = jar.read("META-INF/MANIFEST.MF").decode()
    built = re.search(r"^Implementation-Version: (\S+)", manifest, re.M)
    import keyedstate

    found = [keyedstate.__version__] + [m.group(1) if m else None for m in (pyproject, sbt, built)]
    assert found == [__version__] * 4, (__version__, found)


def test_the_build_the_jvm_and_the_package_support_the_same_spark_versions() -> None:
    """build.sbt's projects, the JVM's version check, the Python package's jar choice and the
    Makefile's older versions name the same Spark minor versions (docs/architecture.md, "Spark
    versions")."""
    from keyedstate._session import SUPPORTED_SPARK, spark_minor

    sbt = (REPO / "build.sbt").read_text()
    check = (JVM_ROOT / "shims" / "SparkVersionCheck.scala").read_text()
    in_sbt = re.search(r"lazy val supportedSparkMinors = Seq\(([^)]*)\)", sbt)
    in_jvm = re.search(r"val Supported: Seq\[String\] = Seq\(([^)]*)\)", check)
    assert in_sbt and in_jvm
    import pyspark

    # The development virtualenv's pyspark is the newest one's release tests/versions runs.
    newest = makefile_words("NEWEST_SPARK")
    assert newest == [pyspark.__version__], (newest, pyspark.__version__)
    from_make = sorted({spark_minor(v) for v in makefile_words("OLDER_SPARK")} | {spark_minor()})
    found = {
        "build.sbt": sorted(re.findall(r'"([\d.]+)"', in_sbt.group(1))),
        "SparkVersionCheck": sorted(re.findall(r'"([\d.]+)"', in_jvm.group(1))),
        "SUPPORTED_SPARK": sorted(SUPPORTED_SPARK),
        "Makefile OLDER_SPARK and NEWEST_SPARK": from_make,
        # scala-spark-<minor>/ per version, beside scala-spark-<from>+/ and <from>-<to>/ (what
        # several versions share).
        "jvm/src/main/scala-spark-*": sorted(
            p.name.removeprefix("scala-spark-")
            for p in JVM_ROOT.parent.parent.parent.glob("scala-spark-*")
            if re.fullmatch(r"scala-spark-\d+\.\d+", p.name)
        ),
    }
    assert len({tuple(v) for v in found.values()}) == 1, found


def test_every_entry_of_the_full_tier_names_tests_that_exist() -> None:
    """tests/support/tiers.py lists test ids by prefix: a renamed test or parameter would leave
    an entry that skips nothing, and CI would run what the list says it leaves out."""
    from tests.support.tiers import FULL_TIER

    modules = sorted({prefix.split("::")[0] for prefix in FULL_TIER})
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
        + modules,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=300,
        check=False,
    )
    ids = [line for line in collected.stdout.splitlines() if "::" in line]
    assert ids, collected.stdout[-2000:] + collected.stderr[-2000:]
    unmatched = [prefix for prefix in FULL_TIER if not any(i.startswith(prefix) for i in ids)]
    assert not unmatched, f"entries of tests/support/tiers.py that match no test: {unmatched}"
