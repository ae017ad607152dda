"""The report's charts: matplotlib to inline SVG strings (no display, no pyplot, no network:
figures are drawn by the SVG backend directly, so no global backend is chosen).

Per path: success rate, p99 latency, attempts per request and stream resets per
stream-hour over time, one line per cohort; then the rollout's progress (share of pods on
each version) above the verdict state at each look. Every chart marks the events on its
time axis (each kind its own colour; kinds with many events as short ticks along the top)
and each test's first crossing. A cohort has the same colour in every chart of a report.

Speed: a day of 50 paths is ~200 charts. One figure per chart kind is built once and
reused (axes, ticks and lines stay; per chart only data, marks and a changed legend are
redone), and text stays text in the SVG (`svg.fonttype: none`, which also keeps it
searchable): ~15 ms a chart.
SVG ids are prefixed per chart so that many charts can share one HTML page.
"""

from __future__ import annotations

import io
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import matplotlib
import numpy as np
import numpy.typing as npt
from matplotlib.artist import Artist
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedFormatter, FixedLocator, MaxNLocator

from probes.verdict.rules import CODES, State

__all__ = ["STATE_COLOURS", "Chart", "ChartJob", "ChartMaker", "palette", "render"]

F64 = npt.NDArray[np.float64]

# Okabe-Ito, without its green and red-orange, which mean pass and fail here.
_PALETTE = ("#0072B2", "#E69F00", "#CC79A7", "#56B4E9", "#8C6D31", "#000000", "#999999")
STATE_COLOURS = {State.PASS: "#1a9850", State.FAIL: "#d73027", State.INCONCLUSIVE: "#bdbdbd",
                 State.NOT_APPLICABLE: "#eeeeee"}
_STATE_NAMES = {State.PASS: "pass", State.FAIL: "fail", State.INCONCLUSIVE: "inconclusive",
                State.NOT_APPLICABLE: "no comparison"}
_EVENT_COLOURS = ("#7b3294", "#525252", "#a6611a", "#018571", "#5e3c99")
_RC: Any = {
    "svg.fonttype": "none",
    "svg.hashsalt": "skewprobe",
    "font.size": 8.5,
    "axes.titlesize": 9.5,
    "axes.titleweight": "bold",
    "axes.titlelocation": "left",
    "axes.titley": 1.0,  # a fixed title position skips a costly layout pass per chart
    "axes.titlepad": 5.0,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#e6e6e6",
    "grid.linewidth": 0.6,
    "legend.fontsize": 7.5,
    "legend.frameon": False,
    "xtick.major.size": 0,  # the grid shows where ticks are; tick marks cost a draw each
    "ytick.major.size": 0,
}
_TICK_STEPS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600,
               43200, 86400, 172800, 604800)
_METRIC_UNITS = {
    "success_rate": "success (%)",
    "latency_p99_ms": "p99 (ms)",
    "attempts_per_request": "attempts / request",
    "stream_resets_per_hour": "resets / stream-hour",
}
Style = dict[str, Any]
_RUG_ABOVE = 20  # kinds with more events in a chart are drawn as ticks, not full lines


@dataclass(frozen=True, slots=True, eq=False)
class ChartJob:
    """One chart: `kind` is a metric name or "rollout".

    Metric charts draw `series` (cohort → value per bucket at `x`); the rollout chart draws
    `series` (version → share in % at `x`, a step function) above the verdict `runs`
    ((start, width, state code) per run of equal states).
    """

    index: int
    kind: str
    path: str
    period: str
    title: str
    size: tuple[float, float]
    since: float
    until: float
    x: F64
    series: dict[str, F64]
    ylim: tuple[float, float] | None
    events: dict[str, F64]
    event_kinds: tuple[str, ...]
    crossings: tuple[float, ...]
    runs: tuple[tuple[float, float, int], ...] = ()
    empty_note: str = ""


@dataclass(frozen=True, slots=True)
class Chart:
    """One rendered chart: what it shows (for the page and the JSON) and its SVG."""

    kind: str
    path: str
    period: str
    title: str
    svg: str


def palette(cohorts: Sequence[str]) -> dict[str, str]:
    """A colour per cohort, in the given (version) order, the same in every chart."""
    return {c: _PALETTE[i % len(_PALETTE)] for i, c in enumerate(cohorts)}


def time_ticks(since: float, until: float, want: int = 6) -> tuple[list[float], list[str]]:
    """Round tick times over [since, until] and their labels (UTC)."""
    span = max(until - since, 1.0)
    step = next((s for s in _TICK_STEPS if span / s <= want), _TICK_STEPS[-1])
    first = math.ceil(since / step) * step
    ticks = [float(t) for t in np.arange(first, until + 1e-9, step)]
    fmt = "%H:%M:%S" if step < 60 else ("%H:%M" if step < 86400 else "%m-%d")
    labels = []
    for i, t in enumerate(ticks):
        d = datetime.fromtimestamp(t, tz=UTC)
        label = d.strftime(fmt)
        if step < 86400 and (i == 0 or (d.hour, d.minute, d.second) == (0, 0, 0)):
            label += d.strftime("\n%b %d")
        labels.append(label)
    return ticks, labels


_IDS = re.compile(r'(\bid="|url\(#|href="#)([^")]+)')


def _prefix_ids(svg: str, prefix: str) -> str:
    """Make the SVG's ids (and the references to them) unique on a page of many charts."""
    return _IDS.sub(lambda m: f"{m.group(1)}{prefix}-{m.group(2)}", svg)


def _escape(text: str) -> str:
    return (text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;"))


def _inline(svg: str, prefix: str, title: str) -> str:
    """An <svg> element for inlining: no XML prolog, scalable, titled, unique ids."""
    svg = svg[svg.index("<svg"):]
    svg = re.sub(r"<metadata>.*?</metadata>", "", svg, count=1, flags=re.S)
    head_end = svg.index(">")
    head = re.sub(r'\s(width|height)="[^"]*"', "", svg[:head_end])
    head += f' class="chart" role="img" aria-label="{_escape(title)}"'
    return _prefix_ids(head + svg[head_end:], prefix)


class _Canvas:
    """One figure reused for every chart of a kind and size."""

    def __init__(self, size: tuple[float, float], rows: int) -> None:
        with matplotlib.rc_context(_RC):
            self.fig = Figure(figsize=size, dpi=100)
            if rows == 1:
                self.axes = [self.fig.add_subplot()]
            else:
                self.axes = list(self.fig.subplots(rows, 1, sharex=True, height_ratios=(3, 1)))
        self.lines: dict[str, Line2D] = {}
        self.span: tuple[float, float] | None = None
        self.legends: dict[int, tuple[object, list[Artist]]] = {}
        self.marks: list[Artist] = []

    def set_span(self, since: float, until: float) -> None:
        if self.span == (since, until):
            return
        self.span = (since, until)
        ticks, names = time_ticks(since, until)
        for i, ax in enumerate(self.axes):
            ax.set_xlim(since, until)
            ax.xaxis.set_major_locator(FixedLocator(ticks))
            last = i == len(self.axes) - 1
            ax.xaxis.set_major_formatter(FixedFormatter(names if last else [""] * len(ticks)))

    def legend(self, ax: Axes, entries: list[tuple[Style, str]], top: float = 1.0) -> None:
        """A legend right of `ax`: a short line in each entry's style and its label.

        Drawn from plain lines and texts, kept while the entries stay the same: half the
        cost of matplotlib's Legend, which lays out its boxes again on every save.
        """
        key = tuple((label, tuple(sorted(style.items()))) for style, label in entries)
        if self.legends.get(id(ax), (None, []))[0] == key:
            return
        for artist in self.legends.get(id(ax), (None, []))[1]:
            artist.remove()
        box = ax.get_position()
        dpi = self.fig.dpi
        height = box.height * self.fig.get_figheight() * dpi
        width = box.width * self.fig.get_figwidth() * dpi
        dy, x0, length = 12.5 / height, 1 + 8 / width, 16 / width
        artists: list[Artist] = []
        for i, (style, label) in enumerate(entries):
            y = top - (i + 0.5) * dy
            line = Line2D([x0, x0 + length], [y, y], transform=ax.transAxes, clip_on=False,
                          solid_capstyle="butt", **style)
            ax.add_artist(line)
            text = ax.text(x0 + length + 5 / width, y, label, transform=ax.transAxes,
                           va="center", ha="left", fontsize=7.5, clip_on=False)
            artists += [line, text]
        self.legends[id(ax)] = (key, artists)

    def svg(self) -> str:
        """The figure as SVG text (call inside `rc_context(_RC)`), then its marks go."""
        buf = io.StringIO()
        self.fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
        for mark in self.marks:
            mark.remove()
        self.marks = []
        return buf.getvalue()


class ChartMaker:
    """Draws `ChartJob`s; one instance per process (its figures are reused)."""

    def __init__(self, colours: Mapping[str, str]) -> None:
        self.colours = dict(colours)
        self._canvases: dict[tuple[str, tuple[float, float]], _Canvas] = {}

    def draw(self, job: ChartJob) -> Chart:
        canvas = self._canvas(job.kind, job.size)
        canvas.set_span(job.since, job.until)
        with matplotlib.rc_context(_RC):
            if job.kind == "rollout":
                self._rollout(canvas, job)
            else:
                self._metric(canvas, job)
            svg = _inline(canvas.svg(), f"c{job.index}", job.title)
        return Chart(job.kind, job.path, job.period, job.title, svg)

    def _canvas(self, kind: str, size: tuple[float, float]) -> _Canvas:
        canvas = self._canvases.get((kind, size))
        if canvas is None:
            canvas = self._canvases[(kind, size)] = _Canvas(size, 2 if kind == "rollout" else 1)
            with matplotlib.rc_context(_RC):
                if kind == "rollout":
                    self._setup_rollout(canvas, size)
                else:
                    ax = canvas.axes[0]
                    ax.set_ylabel(_METRIC_UNITS[kind])
                    ax.yaxis.set_major_locator(MaxNLocator(4))
                    canvas.fig.subplots_adjust(left=0.62 / size[0], right=1 - 1.45 / size[0],
                                               top=0.87, bottom=0.2)
        return canvas

    def _events(self, canvas: _Canvas, ax: Axes, job: ChartJob) -> list[tuple[Style, str]]:
        """Event marks on `ax` (one path per kind: cheap to draw); returns legend entries."""
        entries = []
        for i, kind in enumerate(job.event_kinds):
            times = job.events.get(kind)
            if times is None or not times.size:
                continue
            colour = _EVENT_COLOURS[i % len(_EVENT_COLOURS)]
            few = times.size <= _RUG_ABOVE
            style: Style = ({"color": colour, "linestyle": (0, (2, 2)), "linewidth": 0.9}
                            if few else {"color": colour, "linewidth": 0.6})
            xs = np.repeat(times, 3)
            ys = np.tile([0.0 if few else 0.93, 1.0, np.nan], times.size)
            (mark,) = ax.plot(xs, ys, transform=ax.get_xaxis_transform(), **style)
            canvas.marks.append(mark)
            entries.append((style, kind))
        return entries

    def _metric(self, canvas: _Canvas, job: ChartJob) -> None:
        ax = canvas.axes[0]
        entries: list[tuple[Style, str]] = []
        for cohort in job.series:
            if cohort not in canvas.lines:
                (canvas.lines[cohort],) = ax.plot([], [], linewidth=1.4, markersize=3,
                                                 color=self.colours.get(cohort, "#333"))
        for cohort, line in canvas.lines.items():
            v = job.series.get(cohort)
            line.set_visible(v is not None)
            if v is not None:
                line.set_data(job.x, v)
                line.set_marker("o" if np.isfinite(v).sum() < 3 else "None")
        entries += [({"color": canvas.lines[c].get_color(), "linewidth": 1.4}, c)
                    for c in job.series]  # in version order, oldest first
        entries += self._events(canvas, ax, job)
        for at in job.crossings:
            canvas.marks.append(ax.axvline(at, color=STATE_COLOURS[State.FAIL], linewidth=1.2))
        if job.crossings:
            entries.append(({"color": STATE_COLOURS[State.FAIL], "linewidth": 1.2},
                            "test crossed (fail)"))
        ax.set_ylim(*(job.ylim or (0.0, 1.0)))
        ax.set_title(job.title)
        canvas.legend(ax, entries)

    def _setup_rollout(self, canvas: _Canvas, size: tuple[float, float]) -> None:
        top, bottom = canvas.axes
        top.set_ylim(0, 100)
        top.set_ylabel("pods (%)")
        top.yaxis.set_major_locator(FixedLocator([0, 50, 100]))
        bottom.set_ylim(0, 1)
        bottom.set_yticks([])
        bottom.set_ylabel("verdict", rotation=0, ha="right", va="center")
        bottom.grid(False)
        canvas.fig.subplots_adjust(left=0.62 / size[0], right=1 - 1.45 / size[0], top=0.88,
                                   bottom=0.2, hspace=0.12)
        canvas.legend(bottom, [({"color": STATE_COLOURS[state], "linewidth": 6}, name)
                               for state, name in _STATE_NAMES.items()], top=1.3)

    def _rollout(self, canvas: _Canvas, job: ChartJob) -> None:
        top, bottom = canvas.axes
        entries: list[tuple[Style, str]] = []
        base = np.zeros(job.x.size)
        for version, share in job.series.items():
            colour = self.colours.get(version, "#999999")
            upper = base + share
            canvas.marks.append(top.fill_between(job.x, base, upper, step="post",
                                                 linewidth=0, color=colour, alpha=0.85))
            entries.append(({"color": colour, "linewidth": 6, "alpha": 0.85}, version))
            base = upper
        if job.empty_note:
            canvas.marks.append(top.text(0.5, 0.5, job.empty_note, ha="center",
                                         transform=top.transAxes, color="#777777"))
        for at in job.crossings:
            canvas.marks.append(top.axvline(at, color=STATE_COLOURS[State.FAIL], linewidth=1.2))
        if job.crossings:
            entries.append(({"color": STATE_COLOURS[State.FAIL], "linewidth": 1.2},
                            "first divergence"))
        entries += self._events(canvas, top, job)
        top.set_title(job.title)
        canvas.legend(top, entries)
        for state in _STATE_NAMES:
            bars = [(start, width) for start, width, c in job.runs if c == CODES[state]]
            if bars:
                canvas.marks.append(bottom.broken_barh(
                    bars, (0, 1), facecolors=STATE_COLOURS[state],
                    edgecolor="#cccccc" if state == State.NOT_APPLICABLE else "none",
                    linewidth=0.3))


def render(jobs: Sequence[ChartJob], colours: Mapping[str, str]) -> dict[str, list[Chart]]:
    """Draw every job; per path, its charts in page order."""
    maker = ChartMaker(colours)
    charts = [maker.draw(job) for job in jobs]
    out: dict[str, list[Chart]] = {}
    for chart in charts:
        out.setdefault(chart.path, []).append(chart)
    return out
