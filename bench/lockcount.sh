#!/usr/bin/env bash
# lockcount.sh - locked instructions (`lock`-prefixed, and `xchg` with memory) per 8 B all-reduce
# call, and where they are: each one drains the core's store buffer, and a count is stable
# where times are not. Callgrind of N and 2N calls (1 rank, the `perf` profile, as
# callcount.sh), per-instruction counts matched against the binary's disassembly.
# Usage: bench/lockcount.sh [BIN=target/perf/oxccl-perf] [N=4000]      (needs valgrind, objdump)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${1:-}"
N="${2:-4000}"
# shellcheck source=bench/callgrind_rank.sh
. "$ROOT/bench/callgrind_rank.sh"
callgrind_prelude lockcount.sh
objdump -d --no-show-raw-insn "$BIN" | awk '$2 == "lock" || $2 ~ /^xchg/ {sub(":", "", $1); print $1}' >"$D/locked"
export CALLGRIND_OPTS=--dump-instr=yes
a="$(rank_profile "$D" "$BIN" "$N")"
b="$(rank_profile "$D" "$BIN" $((2 * N)))"
python3 "$ROOT/bench/locked.py" "$a" "$b" $((2 * N)) "$D/locked" | while read -r n addr; do
  case "$addr" in
    0x*)
      # the innermost function of ours, else the innermost one (a std primitive, inlined)
      names="$(addr2line -e "$BIN" -f -i -C "$addr" | awk 'NR % 2 == 1')"
      echo "$n  $(echo "$names" | grep -v -m1 -E '^<?(core|std|alloc)::' || echo "$names" | head -n 1)" ;;
    *) echo "$n $addr" ;;
  esac
done
