"""Check that connector jars built for one Spark release link against another one's jars.

Usage: python dev/connectors/check_links.py CONNECTOR_JAR... --classpath DIR_OR_JAR...

For every class in the connector jars, this reads the constant pool (``javap -v``) and checks
that each class, method and field it references outside the JDK exists on the classpath with the
same descriptor (searching superclasses and interfaces, as the JVM resolves), and that every
concrete class still implements all abstract methods of its supertypes there. A mismatch is what
would fail at run time as NoClassDefFoundError, NoSuchMethodError, NoSuchFieldError or
AbstractMethodError. It cannot see behaviour changes, reflection or semantics; the tests do that.
Exit status 0 when everything links, 1 otherwise (each problem printed).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

JDK_PREFIXES = ("java/", "javax/", "jdk/", "sun/", "com/sun/")
_REF = re.compile(r"=\s+(Methodref|InterfaceMethodref|Fieldref)\s+\S+\s+//\s+(\S+)\.(\S+?):(\S+)$")
_CLASS = re.compile(r"=\s+Class\s+\S+\s+//\s+(\S+)$")
_HEADER = re.compile(r"^(?:[a-z]+ )*(?:class|interface) (\S+)(?: extends (.+?))?(?: implements (.+))?$")


@dataclass
class ClassInfo:
    name: str  # internal form, a/b/C
    is_interface: bool = False
    is_abstract: bool = False
    super_name: str | None = None
    interfaces: list[str] = field(default_factory=list)
    # (name, descriptor) -> access flags text
    members: dict[tuple[str, str], str] = field(default_factory=dict)
    refs: set[tuple[str, str, str, str]] = field(default_factory=set)  # kind, owner, name, desc
    classes: set[str] = field(default_factory=set)


def _strip_generics(text: str) -> str:
    while "<" in text:
        text = re.sub(r"<[^<>]*>", "", text)
    return text


def _member_name(decl: str, class_name: str) -> str:
    decl = decl.rstrip(";").split(" throws ")[0]
    if decl == "static {}":
        return "<clinit>"
    if "(" in decl:
        name = decl[: decl.index("(")].split()[-1]
        return "<init>" if name == class_name.replace("/", ".") else name
    return decl.split()[-1]


def javap(classpath: str, names: list[str]) -> dict[str, ClassInfo]:
    """Parsed ``javap -v -p`` of ``names`` (dotted binary names); missing ones are left out."""
    found: dict[str, ClassInfo] = {}
    for start in range(0, len(names), 400):
        chunk = names[start : start + 400]
        out = subprocess.run(
            ["javap", "-v", "-p", "-cp", classpath, *chunk],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        _parse(out, found)
    return found


def _parse(out: str, found: dict[str, ClassInfo]) -> None:
    info: ClassInfo | None = None
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("Classfile "):
            info = None
            continue
        header = _HEADER.match(_strip_generics(line)) if info is None else None
        if header and not line.startswith(" "):
            name = header.group(1).replace(".", "/")
            info = found.setdefault(name, ClassInfo(name))
            info.is_interface = " interface " in f" {line}"
            info.is_abstract = " abstract " in f" {line} " or info.is_interface
            if header.group(3):
                extra = [s.strip().replace(".", "/") for s in header.group(3).split(",")]
                info.interfaces = extra
            if info.is_interface and header.group(2):  # interfaces "extend" interfaces
                info.interfaces += [
                    s.strip().replace(".", "/") for s in _strip_generics(header.group(2)).split(",")
                ]
            continue
        if info is None:
            continue
        if line.startswith("  super_class:"):
            info.super_name = line.split("//")[-1].strip()
        elif ref := _REF.search(line):
            kind, owner, name, desc = ref.groups()
            info.refs.add((kind, owner.strip('"'), name.strip('"'), desc))
        elif cls := _CLASS.search(line):
            info.classes.add(cls.group(1).strip('"'))
        elif (
            line.startswith("  ")
            and not line.startswith("   ")
            and line.rstrip().endswith(";")
            and i + 2 < len(lines)
            and lines[i + 1].startswith("    descriptor: ")
        ):
            desc = lines[i + 1].split(": ", 1)[1].strip()
            flags = lines[i + 2].split(")", 1)[-1] if "flags" in lines[i + 2] else ""
            info.members[(_member_name(line.strip(), info.name), desc)] = flags


class Classpath:
    def __init__(self, classpath: str) -> None:
        self.classpath = classpath
        self.known: dict[str, ClassInfo | None] = {}

    def load(self, names: set[str]) -> None:
        """Load ``names`` and all their supertypes."""
        todo = {n for n in names if n not in self.known}
        while todo:
            got = javap(self.classpath, sorted(n.replace("/", ".") for n in todo))
            for name in todo:
                self.known[name] = got.get(name)
            todo = set()
            for info in got.values():
                for sup in [info.super_name, *info.interfaces]:
                    if sup and sup not in self.known:
                        todo.add(sup)

    def supertypes(self, name: str) -> list[ClassInfo]:
        """``name`` then its superclasses, then all superinterfaces (JVM resolution order)."""
        chain: list[ClassInfo] = []
        current: str | None = name
        while current and (info := self.known.get(current)):
            chain.append(info)
            current = info.super_name
        seen: set[str] = set()
        interfaces: list[ClassInfo] = []
        stack = [i for c in chain for i in c.interfaces]
        while stack:
            iname = stack.pop(0)
            if iname in seen or not (info := self.known.get(iname)):
                continue
            seen.add(iname)
            interfaces.append(info)
            stack += info.interfaces
        return chain + interfaces

    def has_member(self, owner: str, name: str, desc: str) -> bool:
        return any((name, desc) in c.members for c in self.supertypes(owner))


def _array_or_jdk(name: str) -> bool:
    return name.startswith("[") or name.startswith(JDK_PREFIXES)


def check(connector_jars: list[Path], classpath: list[Path]) -> list[str]:
    jars: list[Path] = []
    for entry in classpath:
        jars += sorted(entry.glob("*.jar")) if entry.is_dir() else [entry]
    cp = Classpath(":".join(str(j) for j in [*connector_jars, *jars]))
    own: list[str] = []
    for jar in connector_jars:
        with zipfile.ZipFile(jar) as archive:
            own += [
                n[: -len(".class")]
                for n in archive.namelist()
                if n.endswith(".class") and not n.startswith(("META-INF/", "module-info"))
            ]
    cp.load(set(own))
    wanted = {
        owner
        for n in own
        if (info := cp.known.get(n))
        for owner in [*(r[1] for r in info.refs), *info.classes]
        if not _array_or_jdk(owner)
    }
    cp.load(wanted)
    problems: list[str] = []
    checked = 0
    for n in sorted(own):
        info = cp.known.get(n)
        if info is None:
            problems.append(f"{n}: could not be read")
            continue
        for owner in sorted(c for c in info.classes if not _array_or_jdk(c)):
            if cp.known.get(owner) is None:
                problems.append(f"{n}: class {owner} is missing")
        for kind, owner, name, desc in sorted(info.refs):
            if _array_or_jdk(owner) or cp.known.get(owner) is None:
                continue
            checked += 1
            if not cp.has_member(owner, name, desc):
                problems.append(f"{n}: {kind} {owner}.{name}:{desc} is missing")
        if not info.is_abstract:
            problems += _unimplemented(cp, info)
    print(f"checked {len(own)} classes, {checked} member references, {len(wanted)} classes used")
    return problems


def _unimplemented(cp: Classpath, info: ClassInfo) -> list[str]:
    supers = cp.supertypes(info.name)
    concrete = {
        key
        for c in supers
        for key, flags in c.members.items()
        if "ACC_ABSTRACT" not in flags and "ACC_STATIC" not in flags
    }
    missing = sorted(
        {
            (c.name, key)
            for c in supers
            for key, flags in c.members.items()
            if "ACC_ABSTRACT" in flags and key not in concrete
        }
    )
    return [f"{info.name}: abstract {owner}.{k[0]}:{k[1]} not implemented" for owner, k in missing]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("connector_jars", nargs="+", type=Path)
    parser.add_argument("--classpath", nargs="+", type=Path, required=True)
    args = parser.parse_args()
    problems = check(args.connector_jars, args.classpath)
    for problem in problems:
        print(problem)
    print(f"{len(problems)} linkage problem(s) in {', '.join(j.name for j in args.connector_jars)}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
