"""Writing a report: report.html, report.md and report.json for a past range, all or none.

`write_report` is `skewprobe report` without argparse (`probes.cli.report`), and what
`skewprobe demo` writes at its end.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from probes._parsing import rfc3339
from probes.errors import BadInput
from probes.spec import JudgingSettings

__all__ = ["ReportFiles", "write_report"]


@dataclass(frozen=True, slots=True)
class ReportFiles:
    html: Path
    markdown: Path
    json: Path
    paths: int
    diverged: tuple[str, ...]


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
    settings: JudgingSettings | None = None,
    baseline: str | None = None,
    canary: str | None = None,
    now: float | None = None,
    origin: str | None = None,
) -> ReportFiles:
    """Build the report for [since, until) and write the three files into `out_dir`.

    `settings`: the verdict's parameters (a run's `config.judging`; default: built-in), and
    `origin` where they came from, as the report says ("config", "store", "defaults";
    default: "config" for given settings).
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
    settings_from = "defaults" if settings is None else origin or "config"
    settings = JudgingSettings() if settings is None else settings
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
    report = Report(store_path, time.time() if now is None else now, settings, settings_from,
                    current, compared)
    colours = palette(report.cohorts)
    charts = render(chart_jobs(report), colours)
    files = ReportFiles(out / "report.html", out / "report.md", out / "report.json",
                        len(current.sections),
                        tuple(s.path for s in current.sections if s.first is not None))
    _write_all({files.json: json.dumps(report_json(report, charts), indent=2) + "\n",
                files.markdown: report_markdown(report),
                files.html: report_html(report, charts, colours)})
    return files
