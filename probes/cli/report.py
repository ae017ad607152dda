"""`skewprobe report`: write report.html, report.md and report.json for a past range.

    skewprobe report --store PATH --from T [--to T] [--path P ...]
                     [--compare-to T1..T2] [--config FILE] --out DIR

Times are RFC 3339 (2026-12-02T09:30:00Z), relative (-6h, -2d, 30m) or `now`.
Exit codes: 0 the report was written; 2 bad input (a time that does not parse, --from not
before --to, a path the store has never seen, a range without data, an output folder that
cannot be written); 4 the store cannot be opened or read. Errors are one line on stderr.

`probes.report.write.write_report` is the same without argparse.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Sequence
from typing import Any

from probes._parsing import parse_time
from probes.cli._stdout import emit
from probes.errors import EXIT_PASS, BadInput
from probes.report.write import write_report

__all__ = ["add_report_parser", "main", "parse_range", "run_report"]

_DAYS = re.compile(r"^(-?)(\d+(?:\.\d+)?)d$")
_RELATIVE = re.compile(r"^-\d*\.?\d+(?:ms|s|m|h|d)?(?:\.\.\S*)?$")


def _time(text: str, now: float, what: str) -> float:
    days = _DAYS.match(text.strip())
    if days:  # parse_time knows s/m/h; a postmortem range is often days back
        text = f"{days.group(1)}{float(days.group(2)) * 24:g}h"
    try:
        return parse_time(text, now=now)
    except BadInput as exc:
        raise BadInput(f"{what}: {exc}") from None


def parse_range(text: str, now: float) -> tuple[float, float]:
    """`T1..T2` (e.g. `-14d..-13d`, or two RFC 3339 times) as (since, until)."""
    if ".." not in text:
        raise BadInput(f"--compare-to {text!r}: write the earlier range as FROM..TO, "
                       "e.g. 2026-11-20T08:00:00Z..2026-11-20T20:00:00Z or -14d..-13d")
    lo, hi = text.split("..", 1)
    since = _time(lo, now, "--compare-to")
    until = _time(hi, now, "--compare-to")
    if since >= until:
        raise BadInput(f"--compare-to {text!r}: its start must be before its end")
    return since, until


def add_report_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add `report` to the `skewprobe` subcommands (`subparsers` from add_subparsers)."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "report", help="write an HTML/Markdown/JSON report comparing cohorts over a past range",
        description=__doc__.splitlines()[0])
    p.add_argument("--store", required=True, help="SQLite store written by `run`")
    p.add_argument("--from", dest="since", required=True,
                   help="start: RFC 3339, -6h, -2d, or now")
    p.add_argument("--to", dest="until", default="now", help="end (default: now)")
    p.add_argument("--path", action="append", help="only this path (repeatable)")
    p.add_argument("--compare-to", help="an earlier range FROM..TO to show side by side")
    p.add_argument("--config", help="config for tolerances, alpha and cohorts (default: those "
                   "`run` recorded in the store, else built-in)")
    p.add_argument("--baseline", help="baseline proxy version (default: oldest)")
    p.add_argument("--canary", help="canary proxy version (default: newest)")
    p.add_argument("--out", required=True, help="folder for report.html, report.md, report.json")
    # `--from -6h`: argparse takes a value starting with "-" for an option unless it looks
    # like a negative number; relative times and ranges (-6h, -14d..-13d) are values here.
    p._negative_number_matcher = _RELATIVE  # type: ignore[attr-defined]
    return p


def run_report(args: argparse.Namespace) -> int:
    """`skewprobe report`: returns the exit code; errors raise SkewprobeError (one line)."""
    from probes.verdict.settings import resolve

    now = time.time()
    since = _time(args.since, now, "--from")
    until = _time(args.until, now, "--to")
    compare = parse_range(args.compare_to, now) if args.compare_to else None
    # The settings `run` recorded by the report's end, unless --config says otherwise.
    resolved = resolve(args.config, args.store, min(until, now))
    if resolved.origin == "store":
        print(f"skewprobe: {resolved.note()}", file=sys.stderr)
    judging = resolved.settings
    files = write_report(
        args.store, args.out, since=since, until=until, paths=args.path, compare=compare,
        settings=judging, baseline=args.baseline or judging.cohort.baseline,
        canary=args.canary or judging.cohort.canary, now=now, origin=resolved.origin,
    )
    diverged = ", ".join(files.diverged) or "none"
    emit(f"report: {files.html} ({files.paths} paths; diverged: {diverged}); "
         f"also {files.markdown.name}, {files.json.name}")
    return EXIT_PASS


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m probes.cli.report ...`: the subcommand on its own, same errors and codes."""
    import sys

    from probes.errors import SkewprobeError

    parser = argparse.ArgumentParser(prog="skewprobe")
    add_report_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["report", *(sys.argv[1:] if argv is None else argv)])
    try:
        return run_report(args)
    except SkewprobeError as exc:
        print(f"skewprobe: error: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
