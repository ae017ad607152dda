"""Run every benchmark in benchmarks/ with modest defaults (`make bench`).

The convention, for anyone adding a benchmark:

- A benchmark is a script `benchmarks/<name>.py` runnable as
  `python benchmarks/<name>.py [options]`. Files whose name starts with `_` (shared helpers)
  and this file are not benchmarks.
- It takes part in `run_all.py` by accepting `--quick`: a run with modest defaults that
  finishes in about two minutes or less on a 2-core machine and prints its figures (a
  Markdown table with the command that produced it) to stdout. A script whose source does
  not mention `--quick` is listed as skipped, not run, so a half-finished script never
  breaks `make bench`.
- Exit 0 when the figures were produced and look sane (e.g. every probe call ok), 1 when
  they were produced but show a failure, 2 for bad options or a missing tool. Anything
  else, or running past `--timeout`, counts as a failed benchmark.
- Benchmarks run one after another, never together: they measure CPU time and latency, and
  two at once would measure each other.

    .venv/bin/python benchmarks/run_all.py                      # all, --quick
    .venv/bin/python benchmarks/run_all.py --only capacity --only fidelity
    .venv/bin/python benchmarks/run_all.py --full --out bench-results/
    .venv/bin/python benchmarks/run_all.py --list

Exit status: 0 when every benchmark that ran exited 0, else 1.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

HERE = Path(__file__).resolve().parent
QUICK = "--quick"


def discover(folder: Path = HERE) -> list[Path]:
    """Every benchmark script in `folder`, sorted by name."""
    return sorted(
        p for p in folder.glob("*.py")
        if not p.name.startswith("_") and p.resolve() != Path(__file__).resolve()
    )


def takes_part(script: Path) -> bool:
    return QUICK in script.read_text(encoding="utf-8")


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _copy(stream: IO[str], log: IO[str] | None) -> None:
    for line in stream:
        sys.stdout.write(line)
        sys.stdout.flush()
        if log is not None:
            log.write(line)


def run(script: Path, args: list[str], timeout_s: float, out_dir: Path | None) -> tuple[int, float]:
    """Run one benchmark, streaming its output; returns (exit code, seconds)."""
    cmd = [sys.executable, str(script), *args]
    print(f"\n### {script.stem}: {' '.join(cmd[1:])}  (loadavg {_load()})", flush=True)
    started = time.monotonic()
    log = (out_dir / f"{script.stem}.md").open("w", encoding="utf-8") if out_dir else None
    try:
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, bufsize=1, cwd=HERE.parent) as proc:
            assert proc.stdout is not None
            # A thread copies the output so the wait below can time out on a silent hang.
            copier = threading.Thread(target=_copy, args=(proc.stdout, log), daemon=True)
            copier.start()
            try:
                rc = proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                print(f"{script.stem}: timed out after {timeout_s:.0f}s", flush=True)
                rc = -1
            copier.join(5)
    finally:
        if log is not None:
            log.close()
    return rc, time.monotonic() - started


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", action="append", default=[], metavar="NAME",
                    help="run only this benchmark (file stem; repeatable)")
    ap.add_argument("--full", action="store_true",
                    help="run each with its own full defaults instead of --quick")
    ap.add_argument("--timeout", type=float, default=900.0,
                    help="seconds allowed per benchmark (900)")
    ap.add_argument("--out", help="also write each benchmark's output to OUT/<name>.md")
    ap.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    args = ap.parse_args(argv)

    scripts = discover()
    if args.only:
        unknown = set(args.only) - {s.stem for s in scripts}
        if unknown:
            print(f"run_all: no benchmark named {', '.join(sorted(unknown))}", file=sys.stderr)
            return 2
        scripts = [s for s in scripts if s.stem in args.only]
    if args.list:
        for s in scripts:
            print(f"{s.stem:20} {'' if takes_part(s) else '(skipped: no --quick)'}")
        return 0
    out_dir = Path(args.out) if args.out else None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)

    results: list[tuple[str, str, float]] = []
    for script in scripts:
        if not takes_part(script):
            print(f"\n### {script.stem}: skipped (does not accept {QUICK})", flush=True)
            results.append((script.stem, "skipped", 0.0))
            continue
        rc, seconds = run(script, [] if args.full else [QUICK], args.timeout, out_dir)
        results.append((script.stem, "ok" if rc == 0 else f"failed (exit {rc})", seconds))

    print("\n### summary\n")
    print("| benchmark | result | seconds |\n|---|---|---|")
    for name, result, seconds in results:
        print(f"| {name} | {result} | {seconds:.0f} |")
    return 0 if all(r in ("ok", "skipped") for _, r, _ in results) else 1


if __name__ == "__main__":
    sys.exit(main())
