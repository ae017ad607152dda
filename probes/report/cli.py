"""`skewprobe report`: write report.html, report.md and report.json for a past range.

    skewprobe report --store PATH --from T [--to T] [--path P ...]
                     [--compare-to T1..T2] [--config FILE] --out DIR

Times are RFC 3339 (2026-12-02T09:30:00Z), relative (-6h, -2d, 30m) or `now`.
Exit codes: 0 the report was written; 2 bad input (a time that does not parse, --from not
before --to, a path the store has never seen, a range without data, an output folder that
cannot be written); 4 the store cannot be opened or read. Errors are one line on stderr.

`write_report` is the same without argparse, for `skewprobe demo`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from probes._exceptions import EXIT_PASS, BadInput
from probes._stdout import emit
from probes._timeparse import parse_time, rfc3339
from probes.report._settings import Settings

if TYPE_CHECKING:
    from probes._spec import Config
    from probes.verdict_service import JudgingSettings

__all__ = ["ReportFiles", "Settings", "add_report_parser", "parse_range", "run_report",
           "write_report"]

_DAYS = re.compile(r"^(-?)(\d+(?:\.\d+)?)d$")
_RELATIVE = re.compile(r"^-\d*\.?\d+(?:ms|s|m|h|d)?(?:\.\.\S*)?$")


@dataclass(frozen=True, slots=True)
class ReportFiles:
    html: Path
    markdown: Path
    json: Path
    paths: int
    diverged: tuple[str, ...]


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


def _writable(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".skewprobe-"):
            pass
    except OSError as exc:
        raise BadInput(f"cannot write the report to {out}: {exc.strerror or exc}") from None


def _write_all(texts: Mapping[Path, str]) -> None:
    """Write every file or none: each to a temporary file beside it first, renamed into
    place only once all are written (a rename needs no space), so a full disk leaves
    neither half a report nor a temporary file."""
    tmps = {path: path.with_name(f".{path.name}.tmp") for path in texts}
    try:
        for path, text in texts.items():
            try:
                tmps[path].write_text(text, encoding="utf-8")
            except OSError as exc:
                raise BadInput(f"cannot write {path}: {exc.strerror or exc}") from None
        for path, tmp in tmps.items():
            os.replace(tmp, path)
    finally:
        for tmp in tmps.values():
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()


def write_report(
    store_path: str,
    out_dir: str | os.PathLike[str],
    *,
    since: float,
    until: float,
    paths: Sequence[str] | None = None,
    compare: tuple[float, float] | None = None,
    settings: Settings | JudgingSettings | Config | None = None,
    baseline: str | None = None,
    canary: str | None = None,
    now: float | None = None,
    origin: str | None = None,
) -> ReportFiles:
    """Build the report for [since, until) and write the three files into `out_dir`.

    `settings`: the verdict's parameters (a run's `Config` will do; default: built-in), and
    `origin` where they came from, as the report says ("config", "store", "defaults").
    Raises BadInput (exit 2) or StoreError (exit 4).
    """
    # Here, not at the top: `skewprobe --help` and the other subcommands need no matplotlib.
    from probes.report._chartdata import chart_jobs
    from probes.report.charts import palette, render
    from probes.report.html import report_html
    from probes.report.jsonout import report_json
    from probes.report.markdown import report_markdown
    from probes.report.model import Report, build_period
    from probes.store import Store

    if since >= until:
        raise BadInput(f"--from {rfc3339(since)} must be before --to {rfc3339(until)}")
    if not isinstance(settings, Settings):
        settings = Settings() if settings is None else Settings(
            tolerances=settings.tolerances, alpha=settings.alpha,
            min_samples=settings.min_samples, warmup_s=settings.warmup_s,
            origin=origin or "config")
    out = Path(out_dir)
    _writable(out)
    store = Store.open(store_path, readonly=True)
    try:
        current = build_period(store, since, until, paths=paths, settings=settings,
                               baseline=baseline, canary=canary, label="this period")
        compared = None
        if compare is not None:
            compared = build_period(store, *compare, paths=[s.path for s in current.sections],
                                    settings=settings, label="compared period")
    finally:
        store.close()
    report = Report(store_path, time.time() if now is None else now, settings, current,
                    compared)
    colours = palette(report.cohorts)
    charts = render(chart_jobs(report), colours)
    files = ReportFiles(out / "report.html", out / "report.md", out / "report.json",
                        len(current.sections),
                        tuple(s.path for s in current.sections if s.first is not None))
    _write_all({files.json: json.dumps(report_json(report, charts), indent=2) + "\n",
                files.markdown: report_markdown(report),
                files.html: report_html(report, charts, colours)})
    return files


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
    from probes.verdict_settings import resolve

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
    """`python -m probes.report.cli ...`: the subcommand on its own, same errors and codes."""
    import sys

    from probes._exceptions import SkewprobeError

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
