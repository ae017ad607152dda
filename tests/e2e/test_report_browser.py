"""The report in a real browser: headless Chromium renders report.html from disk (no
network), and the screenshot must show the page with its charts drawn.

Skipped, saying why, only when no Chromium is installed (`.ci/run` installs the Debian
package `chromium`).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from probes.report.cli import write_report
from tests.servers.report_store import T0, build

CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser",
                                                      "google-chrome")) if p), None)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium on PATH (apt-get install chromium)")


def _screenshot(html: Path, png: Path, profile: Path, height: int) -> None:
    assert CHROMIUM is not None
    subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--hide-scrollbars", f"--user-data-dir={profile}",
         f"--screenshot={png}", f"--window-size=1280,{height}", html.as_uri()],
        check=True, capture_output=True, timeout=90,
    )


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
