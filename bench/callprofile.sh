#!/usr/bin/env bash
# callprofile.sh - where the instructions of one 8 B all-reduce call go, function by function:
# callgrind of N and 2N calls (1 rank, the `perf` profile that compare.sh measures), the
# difference divided by the N extra calls of each half (in place and out of place), so start-up
# and the first calls cancel out. bench/callcount.sh gives the total alone.
# Rows: instructions per call, self (a function's own) then inclusive (with its callees).
# Usage: bench/callprofile.sh [BIN=target/perf/oxccl-perf] [N=4000] [TOP=40] [oxccl-perf args...]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${1:-}"
N="${2:-4000}"
TOP="${3:-40}"
shift $(($# < 3 ? $# : 3))
EXTRA=("$@")
# shellcheck source=bench/callgrind_rank.sh
. "$ROOT/bench/callgrind_rank.sh"
callgrind_prelude callprofile.sh

# calls mode -> "instructions<TAB>function" per line (mode: no = self, yes = inclusive)
costs() {
  callgrind_annotate --inclusive="$2" --threshold=100 --auto=no "$1" 2>/dev/null |
    awk '/^ *[0-9,]+ +\(/ {l = $0; sub(/^ *[0-9,]+ +\( *[0-9.]+%\) +/, "", l); gsub(",", "", $1); print $1 "\t" l}'
}
a="$(rank_profile "$D" "$BIN" "$N" "${EXTRA[@]}")"
b="$(rank_profile "$D" "$BIN" $((2 * N)) "${EXTRA[@]}")"
for mode in no yes; do
  [ "$mode" = no ] && echo "== self, instructions per call" || echo "== inclusive, instructions per call"
  costs "$a" "$mode" >"$D/a"
  costs "$b" "$mode" >"$D/b"
  awk -F'\t' -v n=$((2 * N)) 'NR == FNR {a[$2] = $1; next} {d = ($1 - a[$2]) / n; if (d >= 2) printf "%7.1f  %s\n", d, substr($2, 1, 160)}' \
    "$D/a" "$D/b" | sed 's#/rustc/[0-9a-f]*/library/##; s#'"$ROOT"'/##g' | sort -rn | head -n "$TOP"
done
