"""`skewprobe report` on the command line: arguments, one-line errors and exit codes."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from probes._parsing import rfc3339
from probes.cli.report import add_report_parser, parse_range, run_report
from probes.errors import EXIT_BAD_INPUT, EXIT_UNAVAILABLE, BadInput, StoreError
from probes.report.write import write_report
from tests.servers.report_store import EARLIER, T0, build
from tests.servers.tiny_disk import on_tiny_disk

SPAN = (T0, T0 + 600.0)


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build(tmp_path_factory.mktemp("cli") / "cli.db", minutes=10.0)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "probes.cli.report", *args],
                          capture_output=True, text=True, timeout=120)


def test_the_subcommand_writes_three_files(store: Path, tmp_path: Path) -> None:
    parser = argparse.ArgumentParser(prog="skewprobe")
    add_report_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args([
        "report", "--store", str(store), "--from", rfc3339(SPAN[0]), "--to", rfc3339(SPAN[1]),
        "--path", "checkout", "--compare-to",
        f"{rfc3339(EARLIER)}..{rfc3339(EARLIER + 600)}", "--out", str(tmp_path / "r"),
    ])
    assert run_report(args) == 0
    names = sorted(p.name for p in (tmp_path / "r").iterdir())
    assert names == ["report.html", "report.json", "report.md"]  # no temporary leftovers
    doc = json.loads((tmp_path / "r" / "report.json").read_text())
    assert [p["path"] for p in doc["paths"]] == ["checkout"]
    assert doc["compared"]["from"] == rfc3339(EARLIER)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--from", "yesterday"], "--from: 'yesterday' is not a time"),
        (["--from", rfc3339(SPAN[1]), "--to", rfc3339(SPAN[0])], "must be before --to"),
        (["--path", "nope"], "no data for path(s) nope"),
        (["--compare-to", "-2d"], "write the earlier range as FROM..TO"),
        (["--compare-to", "-1d..-2d"], "its start must be before its end"),
        (["--from", "2001-01-01T00:00:00Z", "--to", "2001-01-02T00:00:00Z"], "no windows from"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(store: Path, tmp_path: Path, args: list[str],
                                          message: str) -> None:
    base = {"--from": rfc3339(SPAN[0]), "--to": rfc3339(SPAN[1])}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        base[flag] = value
    flat = [x for kv in base.items() for x in kv]
    done = _cli("--store", str(store), *flat, "--out", str(tmp_path / "out"))
    assert done.returncode == EXIT_BAD_INPUT, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("skewprobe: error: ") and message in done.stderr


def test_an_unwritable_out_dir_is_bad_input(store: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    done = _cli("--store", str(store), "--from", rfc3339(SPAN[0]), "--to", rfc3339(SPAN[1]),
                "--out", str(blocker / "report"))
    assert done.returncode == EXIT_BAD_INPUT
    assert "cannot write the report to" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("content", [None, b"this is not a database at all" * 100])
def test_an_unreadable_store_is_exit_4(tmp_path: Path, content: bytes | None) -> None:
    db = tmp_path / "broken.db"
    if content is not None:
        db.write_bytes(content)
    done = _cli("--store", str(db), "--from", "-1h", "--out", str(tmp_path / "out"))
    assert done.returncode == EXIT_UNAVAILABLE, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert str(db) in done.stderr


def test_library_errors_are_the_exception_tree(store: Path, tmp_path: Path) -> None:
    with pytest.raises(BadInput, match="must be before"):
        write_report(str(store), tmp_path, since=SPAN[1], until=SPAN[0])
    with pytest.raises(StoreError):
        write_report(str(tmp_path / "missing.db"), tmp_path, since=SPAN[0], until=SPAN[1])


def test_ranges_accept_days_relative_and_rfc3339() -> None:
    now = 1_800_000_000.0
    assert parse_range("-14d..-13d", now) == (now - 14 * 86400, now - 13 * 86400)
    assert parse_range(f"{rfc3339(T0)}..now", now) == (T0, now)
    assert parse_range("-90m..-30m", now) == (now - 5400, now - 1800)


def test_a_full_disk_writes_no_report_file(store: Path, tmp_path: Path) -> None:
    """Written to a disk with room for some of the files but not all: none is left, not even
    a temporary one, and the error is one line (an output that cannot be written: exit 2)."""
    whole = write_report(str(store), tmp_path / "whole", since=SPAN[0], until=SPAN[1])
    sizes = sorted(p.stat().st_size for p in (whole.html, whole.markdown, whole.json))
    # Room for all but the largest file (tmpfs counts whole 4 KiB pages).
    room_kib = sum(-(-n // 4096) * 4 for n in sizes[:-1]) + 4
    assert room_kib * 1024 < sum(sizes), "the files are too small to fill the disk between"
    mnt = tmp_path / "mnt"
    done = on_tiny_disk(mnt, room_kib, [
        sys.executable, "-m", "probes.cli.report", "--store", str(store),
        "--from", rfc3339(SPAN[0]), "--to", rfc3339(SPAN[1]), "--out", str(mnt / "r")],
        after=f'echo "left: $(ls -A "{mnt}/r")"')
    assert done.returncode == EXIT_BAD_INPUT, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "cannot write" in done.stderr and "No space left on device" in done.stderr
    assert done.stdout.strip() == "left:"
