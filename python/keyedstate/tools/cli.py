"""The ``keyedstate`` command line: ``jar``, ``demo``, ``rescale``, ``inspect``, ``savepoint``,
``connect-server``."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import shlex
import sys
import tempfile
import traceback
import urllib.parse
from collections.abc import Iterator
from typing import NoReturn

from keyedstate import _session
from keyedstate._error_catalog import INVALID_OPTION, QUERY_CHECKPOINT_INVALID, RESCALE_REFUSED
from keyedstate.tools import demo


@dataclasses.dataclass
class _SparkLog:
    """Where Spark's output of one command went; removed at the end unless ``keep``."""

    path: str
    keep: bool = True


@contextlib.contextmanager
def _spark_output_to_log(command: str) -> Iterator[_SparkLog]:
    """Spark's JVM (a child process) and its logging write to file descriptor 2: send that to
    a log file for the command's run, and keep the terminal for the command's own lines."""
    fd, path = tempfile.mkstemp(prefix=f"keyedstate-{command}-", suffix=".log")
    sys.stderr.flush()
    terminal_fd = os.dup(2)
    os.dup2(fd, 2)
    os.close(fd)
    terminal = os.fdopen(terminal_fd, "w", buffering=1)
    previous, sys.stderr = sys.stderr, terminal
    log = _SparkLog(path)
    try:
        yield log
    finally:
        sys.stderr = previous
        terminal.flush()
        os.dup2(terminal_fd, 2)
        terminal.close()
        if not log.keep:
            with contextlib.suppress(OSError):
                os.unlink(path)


class _Parser(argparse.ArgumentParser):
    """argparse's refusals in one line (no usage block), exit code 2, as every other error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message}\n")


# Niceness of the job's local processes at --priority low: the lowest, so that a savepoint or
# an inspect beside a running query on the same machine takes only the CPU the query leaves.
LOW_PRIORITY_NICENESS = 19


def _add_spark_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--master",
        default=None,
        help="Spark master for the job (default: spark-submit's, else local[*])",
    )
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting for the job (repeatable), e.g. the checkpoint file system's",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="show Spark's output (by default it goes to a log file named on failure)",
    )
    parser.add_argument(
        "--priority",
        choices=["low", "normal"],
        default="low",
        help="CPU priority of the job's local processes (the driver, and executors of a local "
        "master): low (default) yields the cores to running queries on this machine",
    )


def _spark(args: argparse.Namespace, app: str):  # noqa: ANN202 - pyspark is imported lazily
    from pyspark.sql import SparkSession

    builder = _session.configure(SparkSession.builder.appName(app)).config(
        "spark.ui.showConsoleProgress", "false"
    )
    if args.master:
        builder = builder.master(args.master)
    elif not _has_master():
        builder = builder.master("local[*]")
    for key, value in args.conf:
        builder = builder.config(key, value)
    return builder.getOrCreate()


def _has_master() -> bool:
    return "--master" in os.environ.get("PYSPARK_SUBMIT_ARGS", "")


# The JVM's own bounds (Rescaler.MaxPartitions, CheckpointInspector.MaxKeyGroups), checked here
# too so that a bad argument fails in a moment, before Spark starts.
MAX_PARTITIONS = 100_000
MAX_KEY_GROUPS = 1 << 16


def _checked_before_spark(args: argparse.Namespace) -> str | None:
    """What can be refused without Spark: counts out of range, and a local checkpoint that does
    not exist (other file systems are checked by the job). The refusal's one line, or None."""
    if args.command == "rescale" and not 1 <= args.partitions <= MAX_PARTITIONS:
        return (
            f"[{RESCALE_REFUSED}] Invalid partition count {args.partitions} for rescale: "
            f"allowed is an integer from 1 to {MAX_PARTITIONS}"
        )
    if args.command == "savepoint":
        partitions = getattr(args, "partitions", None)
        if partitions is not None and not 1 <= partitions <= MAX_PARTITIONS:
            return (
                f"[{RESCALE_REFUSED}] Invalid partition count {partitions} for restore: "
                f"allowed is an integer from 1 to {MAX_PARTITIONS}"
            )
        return None
    if args.command == "inspect" and not 1 <= args.key_groups <= MAX_KEY_GROUPS:
        return (
            f"[{INVALID_OPTION}] Invalid key group count {args.key_groups} for inspect: "
            f"allowed is an integer from 1 to {MAX_KEY_GROUPS}"
        )
    location = args.checkpoint
    if location.startswith("file:/"):
        local: str | None = location.removeprefix("file:")
    elif _default_file_system_is_local(args) and "://" not in location:
        local = location
    else:
        local = None  # another file system: the job checks it
    if local is not None and not os.path.exists(local):
        where = os.path.abspath(local)
        return f"[{QUERY_CHECKPOINT_INVALID}] no checkpoint at file:{where}"
    return None


def _default_file_system_is_local(args: argparse.Namespace) -> bool:
    """Whether a path without a scheme is local: no Hadoop configuration directory and no
    ``fs.defaultFS`` setting could make it another file system's (HDFS, say)."""
    if os.environ.get("HADOOP_CONF_DIR") or os.environ.get("YARN_CONF_DIR"):
        return False
    return not any(key.endswith("fs.defaultFS") for key, _ in args.conf)


def _operator(name: str, function: str, uid: str) -> str:
    """An operator as the CLI names it: Spark's name, and a keyed function's function and uid."""
    label = " ".join(part for part in (name, function) if part)
    return label + (f" (uid {uid!r})" if uid else "")


def _rescale(args: argparse.Namespace) -> int:
    from keyedstate.offline.rescale import rescale

    spark = _spark(args, "keyedstate rescale")
    try:
        result = rescale(
            spark, args.checkpoint, args.partitions, args.output, in_place=args.in_place
        )
    finally:
        spark.stop()
    if args.json:
        print(json.dumps(dataclasses.asdict(result), indent=2))
    else:
        print(
            f"rescaled {result.source} from {result.from_partitions} to "
            f"{result.to_partitions} partitions (batch {result.batch_id}): {result.keys} keys, "
            f"{result.stores} store(s), {result.bytes_written} bytes written in "
            f"{result.total_ms / 1000:.1f} s\n"
            f"restart the query with checkpointLocation={result.output}"
        )
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from keyedstate.offline.inspection import inspect

    spark = _spark(args, "keyedstate inspect")
    try:
        report = inspect(spark, args.checkpoint, key_groups=args.key_groups)
    finally:
        spark.stop()
    if args.json:
        print(json.dumps(dataclasses.asdict(report), indent=2))
        return 0
    print(
        f"{report.checkpoint}: batch {report.batch_id}, state version {report.state_version}, "
        f"{report.partitions} partitions, {report.key_groups} key groups"
    )
    for op in report.operators:
        print(
            f"\noperator {op.operator_id} {_operator(op.operator_name, op.function, op.uid)} "
            f"({', '.join(op.stores)}): "
            f"{op.keys} keys, {op.file_bytes} bytes, partition skew {op.partition_skew:.2f}, "
            f"key-group skew {op.key_group_skew:.2f}"
        )
        print(f"  {'store':<28}{'part':>5}{'keys':>12}{'bytes':>14}{'kg skew':>9}{'misplaced':>10}")
        for p in report.partition_reports:
            if p.operator_id == op.operator_id:
                print(
                    f"  {p.store_name:<28}{p.partition:>5}{p.keys:>12}{p.file_bytes:>14}"
                    f"{p.key_group_skew:>9.2f}{p.misplaced_keys:>10}"
                )
    misplaced = sum(p.misplaced_keys for p in report.partition_reports)
    if misplaced:
        print(f"\n{misplaced} key(s) are not in the partition Spark assigns them", file=sys.stderr)
        return 1
    return 0


def _savepoint_by_the_query(args: argparse.Namespace) -> object | None:
    """A native savepoint of a running query taken by the query's own application, asked through
    the query service this machine's registry names for the checkpoint (Flink's CLI asks the
    JobManager): no second Spark application beside the query, and the savepoint yields to the
    query's batches. None when no live service serves a query on the checkpoint: the CLI takes
    it itself."""
    from keyedstate._error_catalog import SERVICE_NOT_FOUND, SERVICE_UNAVAILABLE
    from keyedstate.errors import QueryServiceError
    from keyedstate.service import QueryServiceClient, service_address

    address = service_address(args.checkpoint)
    if address is None:
        return None
    client = QueryServiceClient(address.url, address.token)
    # A local path as this process names it: the query's driver runs in another directory.
    target = args.target
    if not urllib.parse.urlparse(target).scheme:
        target = os.path.abspath(target)
    try:
        if not any(q.run_id == address.run_id for q in client.queries()):
            return None
        request_id = client.trigger_savepoint(address.query_id, target, format=args.format)
    except QueryServiceError as refused:
        # The application is gone, or another one listens there now, or the query stopped
        # meanwhile: the CLI takes the savepoint itself. Any other refusal is the user's to see.
        if refused.error_id in (SERVICE_UNAVAILABLE, SERVICE_NOT_FOUND):
            return None
        raise
    if not args.json:
        print(
            f"the query {address.query_id} runs in application {address.application_id}: the "
            f"savepoint is taken there (query service {address.url})"
        )
    return client.await_savepoint(address.query_id, request_id, target)


def _savepoint(args: argparse.Namespace) -> int:
    from keyedstate.offline import savepoints as ops

    by_the_query = None
    # A canonical savepoint reads every key in Spark jobs, which would hold the query's task
    # slots in its application: it is taken here, in an application of its own.
    if args.action == "create" and args.format == "native" and not args.in_this_process:
        by_the_query = _savepoint_by_the_query(args)
    app = f"keyedstate savepoint {args.action}"
    spark = None if by_the_query is not None else _spark(args, app)
    try:
        if by_the_query is not None:
            result: object = by_the_query
        elif args.action == "create":
            result = ops.savepoint(spark, args.checkpoint, args.target, format=args.format)
        elif args.action == "restore":
            result = ops.restore_savepoint(
                spark,
                args.savepoint,
                args.checkpoint,
                partitions=args.partitions,
                provider=args.provider,
                allow_non_restored_state=args.allow_non_restored_state,
            )
        elif args.action == "inspect":
            result = ops.inspect_savepoint(spark, args.savepoint, verify=args.verify)
        elif args.action == "list":
            result = ops.list_savepoints(spark, args.dir)
        else:
            result = ops.dispose_savepoint(spark, args.savepoint)
    finally:
        if spark is not None:
            spark.stop()
    if args.json:
        rows = result if isinstance(result, list) else [result]
        print(json.dumps([dataclasses.asdict(r) for r in rows], indent=2))  # type: ignore[call-overload]
        return 0
    for info in result if isinstance(result, list) else [result]:
        if isinstance(info, ops.RestoreResult):
            print(
                f"restored {info.savepoint} (batch {info.batch_id}) into {info.checkpoint} at "
                f"{info.to_partitions} partitions: {info.bytes} bytes in "
                f"{info.total_ms / 1000:.1f} s\n"
                f"start the query with checkpointLocation={info.checkpoint}"
            )
            continue
        assert isinstance(info, ops.SavepointInfo)
        verb = {"create": "savepoint written", "dispose": "disposed"}.get(args.action, "savepoint")
        print(
            f"{verb}: {info.path} ({info.format}, batch {info.batch_id} of {info.source}, "
            f"{info.partitions} partitions, {info.files} files, {info.bytes} bytes)"
        )
        for op in info.operators:
            who = _operator(op.name, op.function, op.uid)
            print(f"  operator {op.operator_id} {who}: stores {', '.join(op.stores)}")
    return 0


def _connect_server(args: argparse.Namespace) -> int:
    """``start-connect-server.sh --wait`` with keyedstate's settings (the user's on top): the
    process becomes the server, its Python workers run this Python."""
    settings: dict[str, str] = {}
    for setting in args.conf:
        key, sep, value = setting.partition("=")
        if not sep or not key:
            print(
                f"keyedstate connect-server: --conf expects KEY=VALUE, got {setting!r}",
                file=sys.stderr,
            )
            return 2
        settings[key] = value
    if not 0 < args.port < 65536:
        print(
            f"keyedstate connect-server: --port must be 1 to 65535, got {args.port}",
            file=sys.stderr,
        )
        return 2
    import pyspark

    script = os.path.join(os.path.dirname(pyspark.__file__), "sbin", "start-connect-server.sh")
    # keyedstate's class and jar lists merged into the user's; a provider the user names stays.
    settings = {
        **settings,
        **_session.application_settings(settings),
        **{k: v for k, v in settings.items() if k == _session.PROVIDER_CLASS_KEY},
    }
    if args.kafka:  # as keyedstate.configure(builder, kafka=True) adds it
        packages = settings.get(_session.PACKAGES_KEY, "")
        settings[_session.PACKAGES_KEY] = _session.with_kafka_connector(packages)
    settings.setdefault("spark.connect.grpc.binding.address", args.host)
    settings.setdefault("spark.connect.grpc.binding.port", str(args.port))
    command = [script, "--wait", "--master", args.master]
    for key, value in settings.items():
        command += ["--conf", f"{key}={value}"]
    if args.print:
        print(shlex.join(command))
        return 0
    env = dict(os.environ)
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    os.execve(script, command, env)


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(
        prog="keyedstate",
        description="keyedstate: Flink-style state for Spark Structured Streaming",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    jar = commands.add_parser(
        "jar", help="print the provider jar's path (for --jars or a classpath)"
    )
    jar.add_argument(
        "--spark-version",
        help="the cluster's Spark version, as 4.2 or 4.2.1 (default: the installed pyspark's)",
    )
    commands.add_parser("demo", help="run the demo streaming job")

    rescale = commands.add_parser(
        "rescale", help="rewrite a stopped query's state for another partition count"
    )
    rescale.add_argument("--checkpoint", required=True, help="the query's checkpoint location")
    rescale.add_argument("--partitions", required=True, type=int, help="the new partition count")
    where = rescale.add_mutually_exclusive_group()
    where.add_argument("--output", help="where to write the rescaled checkpoint")
    where.add_argument(
        "--in-place", action="store_true", help="rewrite the checkpoint itself (crash-safe)"
    )
    rescale.add_argument("--json", action="store_true", help="print the result as JSON")
    _add_spark_options(rescale)

    inspect = commands.add_parser(
        "inspect", help="keys, bytes and key-group skew per operator and partition"
    )
    inspect.add_argument("--checkpoint", required=True, help="the query's checkpoint location")
    inspect.add_argument("--key-groups", type=int, default=128, help="key groups to report on")
    inspect.add_argument("--json", action="store_true", help="print the report as JSON")
    _add_spark_options(inspect)

    savepoint = commands.add_parser(
        "savepoint", help="create, restore, inspect, list or dispose of savepoints"
    )
    actions = savepoint.add_subparsers(dest="action", required=True)
    create = actions.add_parser("create", help="a savepoint of a running or stopped query")
    create.add_argument("--checkpoint", required=True, help="the query's checkpoint location")
    create.add_argument("--target", required=True, help="where to write the savepoint")
    create.add_argument(
        "--format",
        choices=["native", "canonical"],
        default="native",
        help="native: the provider's files (default); canonical: Parquet tables",
    )
    create.add_argument(
        "--in-this-process",
        action="store_true",
        help="take a native savepoint of a running query in this process's own Spark "
        "application, not in the query's (by default the CLI asks the query's application "
        "through its query service, docs/query-service.md)",
    )
    restore = actions.add_parser("restore", help="a new checkpoint from a savepoint")
    restore.add_argument("--savepoint", required=True)
    restore.add_argument("--checkpoint", required=True, help="the new checkpoint location")
    restore.add_argument("--partitions", type=int, help="another partition count (rescaled)")
    restore.add_argument(
        "--provider", help="a canonical savepoint's state into another state store provider class"
    )
    restore.add_argument(
        "--allow-non-restored-state",
        action="store_true",
        help="let the query drop a keyed function or state it no longer has",
    )
    show = actions.add_parser("inspect", help="a savepoint's metadata")
    show.add_argument("--savepoint", required=True)
    show.add_argument("--verify", action="store_true", help="read every file, check its CRC32C")
    listing = actions.add_parser("list", help="the savepoints in a directory")
    listing.add_argument("--dir", required=True)
    dispose = actions.add_parser("dispose", help="delete a savepoint")
    dispose.add_argument("--savepoint", required=True)
    for action in (create, restore, show, listing, dispose):
        action.add_argument("--json", action="store_true", help="print the result as JSON")
        _add_spark_options(action)

    server = commands.add_parser(
        "connect-server",
        help="run a Spark Connect server with keyedstate in it, in the foreground "
        "(pyspark's sbin/start-connect-server.sh)",
    )
    server.add_argument("--host", default="127.0.0.1", help="the address to bind")
    server.add_argument("--port", type=int, default=15002, help="the gRPC port (default 15002)")
    server.add_argument("--master", default="local[*]", help="the application's master")
    server.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting"
    )
    server.add_argument(
        "--kafka",
        action="store_true",
        help="add Spark's Kafka connector (the Kafka source and keyedstate's Kafka sink)",
    )
    server.add_argument(
        "--print", action="store_true", help="print the command instead of running it"
    )

    args, rest = parser.parse_known_args(argv)
    if rest and args.command != "demo":  # only the demo passes its arguments on
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:  # the installed pyspark or the jar wrong: one line, exit 2
        if args.command == "jar":
            print(_session.jar_path(args.spark_version))
            return 0
        if args.command == "connect-server":
            return _connect_server(args)
        _session.jar_path()
    except (FileNotFoundError, ValueError) as error:
        commands.choices[args.command].error(str(error))
    from keyedstate.errors import CheckpointOperationError, QueryServiceError

    run = {"rescale": _rescale, "inspect": _inspect, "savepoint": _savepoint}.get(args.command)
    if run is None:
        return demo.main(rest)
    settings = []
    for setting in args.conf:
        key, sep, value = setting.partition("=")
        if not sep or not key:
            print(f"keyedstate: --conf expects KEY=VALUE, got {setting!r}", file=sys.stderr)
            return 2
        settings.append((key, value))
    args.conf = settings
    refused = _checked_before_spark(args)
    if refused is not None:
        print(f"keyedstate {args.command}: {refused}", file=sys.stderr)
        return 2
    if args.priority == "low" and hasattr(os, "nice"):  # POSIX; the JVM Spark starts inherits it
        os.nice(max(0, LOW_PRIORITY_NICENESS - os.nice(0)))
    with contextlib.ExitStack() as stack:
        log = None if args.verbose else stack.enter_context(_spark_output_to_log(args.command))
        where = f" (Spark's log: {log.path})" if log else ""
        try:
            code = run(args)
        except (CheckpointOperationError, QueryServiceError) as e:
            print(f"keyedstate {args.command}: {e}{where}", file=sys.stderr)
            return 2
        except Exception as e:  # noqa: BLE001 - a bug or an environment problem: one line too
            if log:
                with open(log.path, "a", encoding="utf-8") as out:
                    traceback.print_exc(file=out)
            print(f"keyedstate {args.command}: {type(e).__name__}: {e}{where}", file=sys.stderr)
            return 2
        if log:
            log.keep = False
        return code


if __name__ == "__main__":
    raise SystemExit(main())
