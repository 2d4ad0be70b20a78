# callgrind_rank.sh - sourced by callcount.sh and callprofile.sh: profile one rank of oxccl-perf.
#
# callgrind_prelude NAME (with ROOT and BIN set): builds oxccl-perf into BIN if BIN is empty,
# checks that valgrind is there, and makes a temporary folder D, removed at exit.
callgrind_prelude() {
  if [ -z "$BIN" ]; then
    (cd "$ROOT" && cargo build --profile perf -q -p oxccl-bench)
    BIN="$ROOT/target/perf/oxccl-perf"
  fi
  command -v valgrind >/dev/null || { echo "$1: valgrind is not installed" >&2; exit 1; }
  D="$(mktemp -d)"
  trap 'rm -rf "$D"' EXIT
}

# rank_profile DIR BIN CALLS [ARGS...] runs `oxccl-perf --np 1` with CALLS iterations under
# callgrind and prints the path of the rank's profile. The launcher can return before its
# rank's profile is written, so it waits (up to 10 s) until both profiles are complete (callgrind
# ends a file with its `totals:` line); and it picks the rank's by its instruction total, not by
# file size (the launcher's file is about as large). CALLGRIND_OPTS adds options to valgrind's.
rank_profile() {
  local dir="$1" bin="$2" calls="$3" i f
  shift 3
  rm -f "$dir/cg$calls".*
  OXCCL_SOCKET_IFNAME=lo valgrind --tool=callgrind --trace-children=yes ${CALLGRIND_OPTS:-} \
    --callgrind-out-file="$dir/cg$calls.%p" "$bin" --np 1 -b 8 -e 8 -n "$calls" -w 10 -c 0 "$@" >/dev/null 2>&1
  complete() { grep -l '^totals:' "$dir/cg$calls".* 2>/dev/null || true; }
  for i in $(seq 100); do
    [ "$(complete | wc -l)" -ge 2 ] && break
    sleep 0.1
  done
  for f in $(complete); do
    echo "$(grep -m1 '^summary:' "$f" | cut -d' ' -f2) $f"
  done | sort -n | tail -n 1 | cut -d' ' -f2
}
