"""The Python package is laid out by layer: the public API (functions, keyed streams, elements,
``state/``) imports nothing from the engine or the tools, and nothing imports in a cycle."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "python" / "keyedstate"
API = ["functions.py", "keyed_stream.py", "elements.py", "state"]


def module_imports(path: Path) -> list[str]:
    """Top-level (module load time) keyedstate imports of a file."""
    found = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("keyedstate"):
            found.append(str(node.module))
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.startswith("keyedstate")]
    return found


def api_files() -> list[Path]:
    files: list[Path] = []
    for name in API:
        path = PACKAGE / name
        files += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return files


def test_api_modules_import_no_engine_or_tools() -> None:
    for path in api_files():
        for module in module_imports(path):
            assert not module.startswith(
                ("keyedstate.engine", "keyedstate.offline", "keyedstate.tools")
            ), (
                f"{path.relative_to(PACKAGE)} imports {module}"
            )


def test_engine_and_offline_import_no_tools() -> None:
    for layer in ("engine", "offline"):
        for path in sorted((PACKAGE / layer).rglob("*.py")):
            for module in module_imports(path):
                assert not module.startswith("keyedstate.tools"), f"{path.name} imports {module}"


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
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-2000:]


# The JVM side, lowest layer first (docs/architecture.md, "Code layout"): a package may import
# its own layer's and lower layers' packages, never a higher one. "" is the provider itself.
JVM_ROOT = PACKAGE.parent.parent / "jvm" / "src" / "main" / "scala" / "io" / "keyedstate"
JVM_LAYERS = [
    {"errors"},
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
]
# Outside the layers: packages that import no other keyedstate package but the error
# identifiers, and that none imports (the Kafka sink's writer needs nothing of the store).
JVM_STANDALONE = {"sinks"}
# The lowest layer, which imports no other keyedstate package: the standalone ones may use it.
JVM_SHARED = {"errors"}


def jvm_package(path: Path) -> str:
    """``checkpoint.commit`` for .../io/keyedstate/checkpoint/commit/X.scala; "" at the root."""
    relative = path.parent.relative_to(JVM_ROOT)
    return "" if path.parent == JVM_ROOT else str(relative).replace("/", ".")


def test_jvm_packages_import_only_their_own_or_lower_layers() -> None:
    rank = {package: i for i, layer in enumerate(JVM_LAYERS) for package in layer}
    problems = []
    sources = sorted(JVM_ROOT.rglob("*.scala"))
    assert len(sources) > 30, f"the provider's sources are not under {JVM_ROOT}"
    for path in sources:
        package = jvm_package(path)
        assert package in rank or package in JVM_STANDALONE, (
            f"{path.relative_to(JVM_ROOT)}: package {package!r} has no layer"
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
            if (
                package in JVM_STANDALONE
                or imported in JVM_STANDALONE
                or rank[imported] >= rank[package]
            ):
                problems.append(f"{path.relative_to(JVM_ROOT)} ({package or 'provider'}): {line}")
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
