#!/usr/bin/env bash
# callcount.sh - instructions per 8 B all-reduce call, counted by callgrind: stable where times
# are not. One rank (the call's own software, no peer to wait for), the `perf` profile that
# compare.sh measures. Runs N and 2N calls (in and out of place each) and divides the
# difference, so start-up and the first calls cancel out.
# Usage: bench/callcount.sh [BIN=target/perf/oxccl-perf] [N=2000]      (needs valgrind)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${1:-}"
N="${2:-2000}"
# shellcheck source=bench/callgrind_rank.sh
. "$ROOT/bench/callgrind_rank.sh"
callgrind_prelude callcount.sh
total() { # calls -> instructions of the rank
  callgrind_annotate "$(rank_profile "$D" "$BIN" "$1")" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}'
}
a="$(total "$N")"
b="$(total $((2 * N)))"
echo "$(( (b - a) / (2 * N) )) instructions per call ($BIN, 1 rank, 8 B, mean of in and out of place)"
