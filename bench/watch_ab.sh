#!/usr/bin/env bash
# watch_ab.sh - the cost of watching (straggler counters, status off the fast path, per-peer wait
# times, op counters): oxccl-perf built before watching existed (BASE, a commit) against this
# checkout, 2 local ranks, 8 B latency and 1 MiB busbw. Each round runs both, in alternating
# order, so that a round's two runs share the machine's state; the report gives each build's
# median and the median of the per-round ratios with their interquartile range (the noise).
# With METRICS=1 the checkout also serves its metrics (OXCCL_METRICS_PORT=0).
# Usage: bench/watch_ab.sh [REPS=21] [BASE=964434f]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
REPS="${1:-21}"
BASE="${2:-964434f}"
OUT="${OUT:-${TMPDIR:-/tmp}/oxccl-watch-ab}"
mkdir -p "$OUT"; rm -f "$OUT"/*.txt
(cd "$ROOT" && cargo build --release -q -p oxccl-bench)
if [ ! -x "$OUT/base-target/release/oxccl-perf" ]; then
  rm -rf "$OUT/base"; git -C "$ROOT" worktree add -q -f "$OUT/base" "$BASE"
  (cd "$OUT/base" && CARGO_TARGET_DIR="$OUT/base-target" cargo build --release -q -p oxccl-bench)
  git -C "$ROOT" worktree remove -f "$OUT/base"
fi
env=()
[ "${METRICS:-0}" = 1 ] && env+=(OXCCL_METRICS_PORT=0)
run() { # which binary
  env "${@:3}" "$2" -b 8 -e 8 -n 100000 -w 5000 -c 0 | awk '$1 == 8 {print $6}' >> "$OUT/$1.8.txt"
  env "${@:3}" "$2" -b 1M -e 1M -n 1000 -w 50 -c 0 | awk '$1 == 1048576 {print $8}' >> "$OUT/$1.1M.txt"
}
for r in $(seq 1 "$REPS"); do
  if [ $((r % 2)) = 1 ]; then
    run base "$OUT/base-target/release/oxccl-perf"; run head "$ROOT/target/release/oxccl-perf" "${env[@]}"
  else
    run head "$ROOT/target/release/oxccl-perf" "${env[@]}"; run base "$OUT/base-target/release/oxccl-perf"
  fi
done
python3 - "$OUT" <<'PY'
import sys, statistics as st
out = sys.argv[1]
def col(which, size):
    return [float(x) for x in open(f"{out}/{which}.{size}.txt")]
def iqr(v):
    v = sorted(v); q = len(v) // 4
    return v[q], v[-q - 1]
print("| size | before watching | with watching | with / before, per round: median (IQR) |")
print("|---|---|---|---|")
for size, unit, what in (("8", "us", "time"), ("1M", "GB/s", "busbw")):
    b, h = col("base", size), col("head", size)
    r = [y / x for x, y in zip(b, h)]
    lo, hi = iqr(r)
    name = "8 B" if size == "8" else "1 MiB"
    print(f"| {name} | {st.median(b):.2f} {unit} | {st.median(h):.2f} {unit} | {st.median(r):.3f} ({lo:.3f}-{hi:.3f}) {what} |")
print(f"rounds: {len(col('base', '8'))}")
PY
