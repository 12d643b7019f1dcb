"""Fetch one Spark release's jars from its pyspark release on PyPI, for build.sbt's projects of the
older Spark minor versions (``make spark-jars``).

Maven Central has no Spark 4.3 and pyspark's jars are what a Python user runs, so every version's
provider is compiled against the jars inside that version's pyspark source release
(``deps/jars/``). Usage: ``python dev/spark_jars.py 4.2.1 build/spark-jars/4.2``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path


def fetch(version: str, folder: Path) -> int:
    staging = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    with tempfile.TemporaryDirectory() as download:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--no-binary",
                "pyspark",
                "-d",
                download,
                f"pyspark=={version}",
            ],
            check=True,
        )
        (sdist,) = Path(download).glob(f"pyspark-{version}.tar.gz")
        prefix = f"pyspark-{version}/deps/jars/"
        with tarfile.open(sdist) as archive:
            for member in archive.getmembers():
                name = member.name
                jar = name[len(prefix) :]
                if member.isfile() and name.startswith(prefix) and "/" not in jar:
                    extract = archive.extractfile(member)
                    assert extract is not None
                    with extract, (staging / jar).open("wb") as out:  # a plain name: no traversal
                        shutil.copyfileobj(extract, out)
    jars = sorted(staging.glob("*.jar"))
    if not any(jar.name.startswith(f"spark-core_2.13-{version}") for jar in jars):
        sys.exit(
            f"pyspark {version}'s release holds no spark-core_2.13-{version} jar under {prefix}"
        )
    shutil.rmtree(folder, ignore_errors=True)
    staging.rename(folder)
    return len(jars)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python dev/spark_jars.py <pyspark version> <folder>")
    count = fetch(sys.argv[1], Path(sys.argv[2]))
    print(f"{count} jars of Spark {sys.argv[1]} in {sys.argv[2]}")
