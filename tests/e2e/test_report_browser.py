"""The report in a real browser: headless Chromium renders report.html from disk (no
network), and the screenshot must show the page with its charts drawn, and a relay path's
pair matrix with each cell in its state's tint.

Skipped, saying why, only when no Chromium is installed (`.ci/run` installs the Debian
package `chromium`).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from probes.report.write import write_report
from tests.servers.report_store import RELAY_NEW, RELAY_OLD, T0, build, build_relay

CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser",
                                                      "google-chrome")) if p), None)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium on PATH (apt-get install chromium)")


def _chromium(profile: Path, *args: str) -> str:
    assert CHROMIUM is not None
    return subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--hide-scrollbars", f"--user-data-dir={profile}", *args],
        check=True, capture_output=True, timeout=90, text=True,
    ).stdout


def _screenshot(html: Path, png: Path, profile: Path, height: int) -> None:
    _chromium(profile, f"--screenshot={png}", f"--window-size=1280,{height}", html.as_uri())


def _near(pixels: np.ndarray, rgb: str, tol: float = 0.08) -> int:
    """Pixels within `tol` (0..1 per channel) of a #rrggbb colour."""
    want = np.array([int(rgb[i:i + 2], 16) / 255 for i in (1, 3, 5)])
    return int((np.abs(pixels - want).max(axis=-1) < tol).sum())


def test_chromium_renders_every_chart(tmp_path: Path) -> None:
    db = build(tmp_path / "browser.db", minutes=20.0, earlier=False)
    files = write_report(str(db), tmp_path / "out", since=T0, until=T0 + 1200, now=T0 + 1200)
    png = tmp_path / "shot.png"
    _screenshot(files.html, png, tmp_path / "profile", 4200)
    image = imread(str(png))[..., :3]  # floats in [0, 1], RGB
    assert image.shape[:2] == (4200, 1280)
    # Measured: the page without its charts draws ~3 % of pixels darker than 0.9, in ~1,300
    # colours (text anti-aliasing); with them, ~12 % in ~10,000.
    drawn = (image < 0.9).any(axis=-1).mean()
    assert drawn > 0.06, f"the page is mostly blank ({drawn:.1%} drawn)"
    colours = len(np.unique((image * 255).astype(np.uint8).reshape(-1, 3), axis=0))
    assert colours > 3000, f"only {colours} distinct colours: the charts were not drawn"
    # The cohorts' lines and the rollout's areas (blue: baseline, orange: canary) and the
    # failed verdict (red) are on screen, far more than the page's chips and badges hold.
    assert _near(image, "#0072B2") > 5000
    assert _near(image, "#E69F00") > 5000
    assert _near(image, "#d73027") > 5000


def test_chromium_renders_the_pair_matrix(tmp_path: Path) -> None:
    db = build_relay(tmp_path / "relay.db", minutes=20.0, direct=False)
    files = write_report(str(db), tmp_path / "out", since=T0, until=T0 + 1200, now=T0 + 1200)
    # The DOM as Chromium built it: the matrix is a table of 2 callers × 2 callees, each
    # cell classed by its state (the new callers retry every call: both their pairs fail).
    dom = _chromium(tmp_path / "profile", "--dump-dom", files.html.as_uri())
    table = re.search(r'<table class="pairs">(.*?)</table>', dom, re.S)
    assert table is not None, "no pair matrix in the rendered page"
    rows = re.findall(r"<tr>(.*?)</tr>", table.group(1), re.S)
    states = [re.findall(r'<td class="pair (\w+)">', row) for row in rows[1:]]
    assert states[0][0] == "baseline" and states[1] == ["fail", "fail"], states
    assert [re.findall(r"caller ([\d.]+)", r) for r in rows[1:]] == [[RELAY_OLD], [RELAY_NEW]]
    png = tmp_path / "shot.png"
    _screenshot(files.html, png, tmp_path / "profile", 1400)
    image = imread(str(png))[..., :3]
    # On screen: the two failing cells in the fail tint. Each cell's box is at least
    # 190 × 64 px (the page's CSS); its badge and four lines of figures cover less than
    # half of it, so two cells show more than one box's worth of the tint.
    assert _near(image, "#fbe3e0", tol=0.02) > 190 * 64
    assert _near(image, "#e4edf7", tol=0.02) > 190 * 64 // 2  # the old-old (baseline) cell
