#!/usr/bin/env bash
# A test tier, N times from a clean clone, with two CPU hogs beside it: a test whose bounds
# come from what it measured passes on a loaded machine too. The tier runs on PYTEST_WORKERS
# (default 2) xdist workers, as `make test` runs it. Usage:
#   scripts/stress.sh [RUNS] [TIER] [REPO]  (defaults: 10 runs of tests/e2e at this HEAD)
# Prints one line per run and "failed F of N"; exits 1 if any run failed.
set -u
runs=${1:-10}
tier=${2:-e2e}
repo=${3:-$(git rev-parse --show-toplevel)}
work=$(mktemp -d)
trap 'kill $hogs 2>/dev/null; rm -rf "$work"' EXIT
git clone -q "$repo" "$work/clone"
cd "$work/clone"
make -s lint >/dev/null 2>&1 || { echo "make lint failed in the clone"; exit 2; }  # bootstraps .venv
hogs=""
for _ in 1 2; do (while :; do :; done) & hogs="$hogs $!"; done
failed=0
for i in $(seq 1 "$runs"); do
  start=$(date +%s)
  if .venv/bin/pytest -q -p no:randomly -n "${PYTEST_WORKERS:-2}" "tests/$tier" > "$work/run-$i.log" 2>&1; then
    echo "run $i: passed in $(( $(date +%s) - start )) s ($(tail -1 "$work/run-$i.log"))"
  else
    failed=$((failed + 1))
    echo "run $i: FAILED in $(( $(date +%s) - start )) s"
    grep -E "^(FAILED|ERROR) tests/" "$work/run-$i.log" | sed "s/^/  /"
    cp "$work/run-$i.log" "${TMPDIR:-/tmp}/stress-$tier-run-$i.log"  # kept: the clone is removed
    echo "  log: ${TMPDIR:-/tmp}/stress-$tier-run-$i.log"
  fi
done
echo "failed $failed of $runs runs of tests/$tier (two CPU hogs beside every run)"
[ "$failed" -eq 0 ]
