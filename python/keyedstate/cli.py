"""The ``keyedstate`` command line."""

from __future__ import annotations

import argparse

from keyedstate import _session, demo


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="keyedstate",
        description="keyedstate: Flink-style state for Spark Structured Streaming",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("jar", help="print the provider jar's path (for --jars or a classpath)")
    commands.add_parser("demo", help="run the demo streaming job")
    args, rest = parser.parse_known_args(argv)
    if args.command == "jar":
        print(_session.jar_path())
        return 0
    return demo.main(rest)


if __name__ == "__main__":
    raise SystemExit(main())
