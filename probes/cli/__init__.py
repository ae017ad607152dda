"""`skewprobe ...`: every subcommand, its options, its output and its exit code.

Here: the parser and the dispatch, and the subcommands `run`, `validate`, `verdict`. The
other subcommands each have a module: `inventory`, `plan` (its table and Markdown in
`_plan_format`), `report`, `demo`. `_stdout` is their output, quiet when the reader goes
away. Run as the console script `skewprobe` or as `python -m probes.cli`.

Exit codes (docs/design.md, "External contracts"): 0 pass / ok, 1 fail, 2 bad input,
3 inconclusive, 4 data source unavailable, 5 (`demo` only) the machine too busy. Every error
is one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

from probes.cli._stdout import emit, quiet_stdout
from probes.errors import (
    EXIT_BAD_INPUT,
    EXIT_FAIL,
    EXIT_INCONCLUSIVE,
    EXIT_PASS,
    BadInput,
    SkewprobeError,
)
from probes.spec import DEFAULT_LISTEN

if TYPE_CHECKING:
    from probes.verdict.pairs import PairedVerdict
    from probes.verdict.settings import Resolved

__all__ = [
    "EXIT_STDOUT_CLOSED",
    "build_parser",
    "main",
]

# Libraries that log what crosses the wire at debug level: hpack every header it encodes or
# decodes (a path's `headers:` / gRPC `metadata:` credentials, in clear text or as an HPACK
# block that decodes to them), kubernetes-asyncio every API response body (pod specs with
# their env values). `-v` must never print a secret, so these stay above debug.
_WIRE_LOGGERS = ("hpack", "kubernetes_asyncio.client.rest")

_VERDICT_EXIT = {"pass": EXIT_PASS, "fail": EXIT_FAIL, "inconclusive": EXIT_INCONCLUSIVE}

# What a shell shows for a process that SIGPIPE ended (128 + 13), as 130 is for ^C: the exit
# of a command whose reader went away before the command knew its own answer.
EXIT_STDOUT_CLOSED = 141


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"skewprobe: error: {message} (see --help)\n")


def _duration(text: str) -> float:
    from probes.config import parse_duration

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_parser() -> argparse.ArgumentParser:
    from probes import __version__

    parser = _Parser(prog="skewprobe", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"skewprobe {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at debug level")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("run", help="probe the configured targets and serve the API")
    run.add_argument("--config", required=True, help="YAML config file")
    run.add_argument("--store", help="SQLite store (default: the config's store.path)")
    run.add_argument("--listen", help=f"API address (default {DEFAULT_LISTEN}); 'none' disables it")
    run.add_argument("--duration", type=_duration, help="stop after this long (e.g. 60s)")
    run.add_argument("--quiet", action="store_true",
                     help="no cost line, progress lines or summary; warnings and errors only")
    run.add_argument("--shard", metavar="I/N",
                     help="probe only shard I of N of the endpoints (stable hash of the name);"
                          " I may be a StatefulSet pod's name, its ordinal last (probe-2/3)")
    api = run.add_argument_group("API access (each overrides the config's api: block)")
    api.add_argument("--token-file", metavar="FILE",
                     help="require this bearer token (the file's content) on every route but"
                          " /healthz; also SKEWPROBE_API_TOKEN")
    api.add_argument("--api-cert", metavar="FILE", help="serve the API over TLS: certificate")
    api.add_argument("--api-key", metavar="FILE", help="serve the API over TLS: private key")
    api.add_argument("--api-client-ca", metavar="FILE",
                     help="require client certificates signed by this CA (mTLS)")

    validate = sub.add_parser("validate", help="check a config file")
    validate.add_argument("file", nargs="?", help="YAML config file")
    validate.add_argument("--schema", action="store_true", help="print the config's JSON Schema")
    validate.add_argument("--openapi", action="store_true",
                          help="print the API's OpenAPI description (GET /openapi.json)")

    verdict = sub.add_parser("verdict", help="judge the canary cohort against the baseline")
    source = verdict.add_mutually_exclusive_group(required=True)
    source.add_argument("--store", help="SQLite store written by `run`")
    source.add_argument("--prometheus", metavar="URL",
                        help="judge every probe's series in this Prometheus (HTTP API)")
    verdict.add_argument("--selector", help='label matchers for --prometheus (job="skewprobe")')
    verdict.add_argument("--config", help="config for tolerances and alpha (default: those "
                         "`run` recorded in the --store, else built-in)")
    verdict.add_argument("--path", action="append", help="only this path (repeatable)")
    verdict.add_argument("--baseline", help="baseline proxy version (default: oldest)")
    verdict.add_argument("--canary", help="canary proxy version (default: newest)")
    verdict.add_argument("--since", help="start of the comparison: RFC 3339, -30m, or 30m")
    verdict.add_argument("--at", help="the verdict as it stood then: RFC 3339, -2h, or epoch "
                         "seconds (default: now)")
    verdict.add_argument("--json", action="store_true", help="print the verdict JSON")

    from probes.cli.inventory import add_inventory_parser
    from probes.cli.plan import add_plan_parser
    from probes.cli.report import add_report_parser

    add_inventory_parser(sub)
    add_plan_parser(sub)
    add_report_parser(sub)

    demo = sub.add_parser("demo", help="run the local fleet with a simulated rollout and probe it")
    demo.add_argument("--pods", type=int, default=12)
    demo.add_argument("--rollout", type=_duration, default=40.0, help="rollout length (40s)")
    demo.add_argument("--store", default="skewprobe-demo.db")
    demo.add_argument("--out", default="skewprobe-report", help="report folder")
    demo.add_argument("--quiet", action="store_true", help="no live progress lines")
    demo.add_argument("--proxy", choices=("emulated", "haproxy"), default="emulated",
                      help="the fleet's sidecars: the Python emulation, or real HAProxy")
    for command in sub.choices.values():
        # `skewprobe run -v` as well as `skewprobe -v run`: unset unless given here, so the
        # subcommand does not reset what was given before it.
        command.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                             help="log at debug level")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="skewprobe: %(levelname)s %(name)s: %(message)s",
    )
    for name in _WIRE_LOGGERS:
        logging.getLogger(name).setLevel(logging.INFO)
    if argv is None and args.command == "verdict":
        # The process is this one verdict (not a caller's, such as a test's): no memory to
        # give back before it ends.
        from probes._heap import keep_freed_memory

        keep_freed_memory()
    try:
        return _dispatch(args)
    except SkewprobeError as exc:
        print(f"skewprobe: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # Output printed other than by `emit` (the demo's progress): stop quietly.
        quiet_stdout()
        return EXIT_STDOUT_CLOSED



def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "validate":
        return _validate(args)
    if args.command == "run":
        return _run(args)
    if args.command == "verdict":
        return _verdict(args)
    if args.command == "report":
        from probes.cli.report import run_report

        return run_report(args)
    if args.command == "inventory":
        from probes.cli.inventory import run_inventory

        return run_inventory(args)
    if args.command == "plan":
        from probes.cli.plan import run_plan

        return run_plan(args)
    if args.command == "demo":
        from probes.cli.demo import run_demo

        return run_demo(
            pods=args.pods, rollout_s=args.rollout, store=args.store, out=args.out,
            quiet=args.quiet, proxy=args.proxy,
        )
    raise BadInput(f"unknown command {args.command}")


def _validate(args: argparse.Namespace) -> int:
    if args.schema:
        from probes._schema import SCHEMA

        emit(json.dumps(SCHEMA, indent=2))
        return EXIT_PASS
    if args.openapi:
        from probes.api import openapi_json

        emit(openapi_json(indent=2))
        return EXIT_PASS
    if not args.file:
        raise BadInput("validate needs a config FILE (or --schema, --openapi)")
    from probes.config import load_config

    config = load_config(args.file)
    kinds = ", ".join(f"{p.name} ({p.kind})" for p in config.paths)
    emit(f"{args.file}: ok: {len(config.paths)} paths: {kinds}")
    return EXIT_PASS


def _run(args: argparse.Namespace) -> int:
    from probes.config import load_config
    from probes.discovery.shard import parse_shard
    from probes.run import ProbeRunner, RunOptions, resolve_access

    config = load_config(args.config)
    # What the paths will cost (once at start), a progress line a minute and the summary
    # at the end (`probes.run._status`) are `run`'s output, unless --quiet.
    if not args.quiet:
        for name in ("skewprobe.cost", "skewprobe.progress"):
            logger = logging.getLogger(name)
            logger.setLevel(min(logger.getEffectiveLevel(), logging.INFO))
    listen = config.listen if args.listen is None else args.listen
    access = resolve_access(config.api, token_file=args.token_file, cert=args.api_cert,
                            key=args.api_key, client_ca=args.api_client_ca)
    options = RunOptions(
        store_path=args.store or config.store,
        listen=None if listen == "none" else listen,
        duration_s=args.duration,
        shard=parse_shard(args.shard) if args.shard else None,
        token=access.token,
        api_tls=access.tls,
    )
    asyncio.run(ProbeRunner(config, options).run())
    return EXIT_PASS


def _verdict(args: argparse.Namespace) -> int:
    import time

    from probes.spec import PrometheusSettings
    from probes.verdict.entry import Query, StoreSource, verdict
    from probes.verdict.service import verdict_time
    from probes.verdict.settings import Resolved, load_judging_config, resolve

    now = verdict_time(args.at, now=time.time())
    if args.prometheus:
        resolved = Resolved(load_judging_config(args.config),
                            "defaults" if args.config is None else "config")
    else:
        # The settings `run` recorded, unless --config says otherwise; said on stderr.
        resolved = resolve(args.config, args.store, now)
        if resolved.origin == "store":
            print(f"skewprobe: {resolved.note()}", file=sys.stderr)
    query = Query(now=now, path=args.path, baseline=args.baseline, canary=args.canary,
                  since=args.since)
    if args.prometheus:
        import dataclasses

        from probes.config import load_config

        # The config's prometheus: keys (selector, step, headers ...), with this URL.
        full = load_config(args.config) if args.config else None
        base = full.prometheus if full is not None else None
        prom = dataclasses.replace(base or PrometheusSettings(url=""), url=args.prometheus)
        if args.selector is not None:
            prom = dataclasses.replace(prom, selector=args.selector)
    source = prom if args.prometheus else StoreSource(args.store)
    # From a store, each relay path is its caller × callee matrix (`probes.verdict.pairs`),
    # whose failing pair fails the whole verdict.
    return _emit_verdict(args, verdict(query, resolved.settings, source), resolved)


def _emit_verdict(args: argparse.Namespace, judged: PairedVerdict, resolved: Resolved) -> int:
    """Print a verdict (JSON, with the settings used, or the table with each pair matrix);
    its state's exit code."""
    from probes.verdict.service import format_table
    from probes.verdict.settings import settings_json

    if args.json:
        emit(json.dumps({**judged.to_json(), "settings": settings_json(resolved)}, indent=2))
    else:
        emit(judged.format(format_table))
    return _VERDICT_EXIT[judged.verdict]

