#!/usr/bin/env bash
# watch_ab.sh - the cost of watching (straggler counters, status off the fast path, per-peer wait
# times, op counters): oxccl-perf built before watching existed (BASE, a commit) against this
# checkout, 2 local ranks, 8 B latency and 1 MiB busbw, interleaved (base, head, head, base, ...)
# for REPS rounds, then the medians and the ratios. Usage: bench/watch_ab.sh [REPS=7] [BASE=964434f]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
REPS="${1:-7}"
BASE="${2:-964434f}"
OUT="${OUT:-${TMPDIR:-/tmp}/oxccl-watch-ab}"
mkdir -p "$OUT"; rm -f "$OUT"/*.txt
(cd "$ROOT" && cargo build --release -q -p oxccl-bench)
if [ ! -x "$OUT/base-target/release/oxccl-perf" ]; then
  rm -rf "$OUT/base"; git -C "$ROOT" worktree add -q -f "$OUT/base" "$BASE"
  (cd "$OUT/base" && CARGO_TARGET_DIR="$OUT/base-target" cargo build --release -q -p oxccl-bench)
  git -C "$ROOT" worktree remove -f "$OUT/base"
fi
run() { # which binary
  "$2" -b 8 -e 8 -n 20000 -w 2000 -c 0 >> "$OUT/$1.txt"
  "$2" -b 1M -e 1M -n 300 -w 30 -c 0 >> "$OUT/$1.txt"
}
for r in $(seq 1 "$REPS"); do
  if [ $((r % 2)) = 1 ]; then
    run base "$OUT/base-target/release/oxccl-perf"; run head "$ROOT/target/release/oxccl-perf"
  else
    run head "$ROOT/target/release/oxccl-perf"; run base "$OUT/base-target/release/oxccl-perf"
  fi
done
python3 - "$OUT" <<'PY'
import sys, statistics as st, collections
out = sys.argv[1]
def rows(which):
    d = collections.defaultdict(lambda: ([], []))
    for l in open(f"{out}/{which}.txt"):
        f = l.split()
        if not f or f[0].startswith('#') or not f[0].isdigit():
            continue
        d[int(f[0])][0].append(float(f[5])); d[int(f[0])][1].append(float(f[7]))
    return d
base, head = rows("base"), rows("head")
print("| size | before watching | with watching | with / before |")
print("|---|---|---|---|")
for size in sorted(base):
    b, h = base[size], head[size]
    if size <= 4096:
        mb, mh = st.median(b[0]), st.median(h[0])
        print(f"| {size} B | {mb:.2f} us | {mh:.2f} us | {mh / mb:.3f} (time) |")
    else:
        mb, mh = st.median(b[1]), st.median(h[1])
        print(f"| {size >> 20} MiB | {mb:.2f} GB/s | {mh:.2f} GB/s | {mh / mb:.3f} (busbw) |")
print(f"rounds: {len(base[8][0])} each; per-round 8 B times base {sorted(base[8][0])} head {sorted(head[8][0])}")
PY
