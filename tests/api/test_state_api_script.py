"""The API from a user's script: functions defined in ``__main__`` (as in a script or a notebook
cell, both run in ``__main__``) are shipped to the executors by value, with no module to import.

Also what a new user trips over in one Python process: a module-level global read by a function
class, changed between two queries, is seen changed by the second query (Python workers are
reused, and cloudpickle reuses a class it unpickled before, with the first query's globals); and
``reduce`` hands the function two rows of the input.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from pyspark.sql import SparkSession
    import keyedstate
    from keyedstate import KeyedProcessFunction, MapStateDescriptor, RuntimeContext

    class Totals(KeyedProcessFunction):
        def open(self, runtime_context: RuntimeContext) -> None:
            self.totals = runtime_context.get_map_state(MapStateDescriptor("t", str, int))

        def process_element(self, value, ctx):
            total = (self.totals.get(value.item) or 0) + value.n
            self.totals.put(value.item, total)
            yield ctx.get_current_key(), value.item, total

    def running(value, count: int | None):
        return (value.user, (count or 0) + 1), (count or 0) + 1

    THRESHOLD = 4

    class AboveThreshold(KeyedProcessFunction):
        def process_element(self, value, ctx):
            if value.n > THRESHOLD:
                yield value.user, value.n

    workdir = sys.argv[1]
    spark = (
        keyedstate.configure(SparkSession.builder.master("local[2]").appName("script"))
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    with open(f"{workdir}/input/part-0.json", "w") as out:
        for user, item, n in [("u1", "x", 2), ("u2", "x", 1), ("u1", "y", 5), ("u1", "x", 3)]:
            out.write(json.dumps({"user": user, "item": item, "n": n}) + "\\n")
    events = spark.readStream.schema("user string, item string, n long").json(f"{workdir}/input")
    keyed = keyedstate.key_by(events, "user")
    results = {}

    def run(name, frame):
        query = (
            frame.writeStream.format("memory").queryName(name)
            .option("checkpointLocation", f"{workdir}/checkpoint-{name}")
            .trigger(availableNow=True).start()
        )
        query.awaitTermination()
        results[name] = sorted(tuple(r) for r in spark.table(name).collect())

    run("totals", keyed.process(Totals(), [("user", str), ("item", str), ("total", int)]))
    run("counts", keyed.map_with_state(running, "user string, count long"))
    run("above_4", keyed.process(AboveThreshold(), "user string, n long"))
    THRESHOLD = 1
    run("above_1", keyed.process(AboveThreshold(), "user string, n long"))
    run("reduce", keyed.reduce(lambda a, b: (a.user, a.item, a.n + b.n)))
    print("RESULT " + json.dumps(results))
    spark.stop()
    """
)


def test_functions_defined_in_main_run_on_the_executors(tmp_path: Path) -> None:
    (tmp_path / "input").mkdir()
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-3000:]
    results = json.loads(lines[0][len("RESULT ") :])
    assert results == {
        "totals": [["u1", "x", 2], ["u1", "x", 5], ["u1", "y", 5], ["u2", "x", 1]],
        "counts": [["u1", 1], ["u1", 2], ["u1", 3], ["u2", 1]],
        "above_4": [["u1", 5]],
        "above_1": [["u1", 2], ["u1", 3], ["u1", 5]],
        "reduce": [["u1", "x", 2], ["u1", "x", 7], ["u1", "x", 10], ["u2", "x", 1]],
    }
