#!/usr/bin/env bash
# encrypt_ab.sh - the cost of encryption between hosts: oxccl-perf on 2 network-namespace hosts
# with OXCCL_ENCRYPT off and psk, interleaved (off, psk, off, psk, ...) for REPS rounds, then the
# medians per size and the ratios. Root (network namespaces). Usage: bench/encrypt_ab.sh [REPS=5]
# NET=ofi: over the RDMA protocol on libfabric's TCP emulation (tcp;ofi_rxm) instead of oxccl's TCP.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SHARED="${OXCCL_SHARED:-$ROOT/../shared}"
REPS="${1:-5}"
OUT="${OUT:-${TMPDIR:-/tmp}/oxccl-encrypt-ab}"
mkdir -p "$OUT"; rm -f "$OUT"/*.txt
(cd "$ROOT" && cargo build --release -q -p oxccl-bench)
PERF="$ROOT/target/release/oxccl-perf"
KEY="$OUT/psk"; printf 'encryption benchmark pre-shared key of 32+ bytes\n' > "$KEY"
"$SHARED/netns/netns_up.sh" -n 2 >/dev/null
trap '"$SHARED/netns/netns_down.sh" >/dev/null 2>&1 || true' EXIT
run() { # mode round
  local env=(OXCCL_SOCKET_IFNAME=cclt-br0)
  [ -n "${NET:-}" ] && env+=(OXCCL_NET="$NET" "OXCCL_OFI_PROVIDER=tcp;ofi_rxm")
  [ "$1" = psk ] && env+=(OXCCL_ENCRYPT=psk OXCCL_PSK_FILE="$KEY")
  env "${env[@]}" "$PERF" --np 2 --netns cclt-h1,cclt-h2 -s 8,4K,64K -n 1000 -w 50 -c 0 >> "$OUT/$1.txt"
  env "${env[@]}" "$PERF" --np 2 --netns cclt-h1,cclt-h2 -s 1M,16M,64M,256M -n 20 -w 3 -c 0 >> "$OUT/$1.txt"
}
for r in $(seq 1 "$REPS"); do
  run off "$r"; run psk "$r"
done
python3 - "$OUT" <<'PY'
import sys, statistics as st, collections
out = sys.argv[1]
def rows(mode):
    d = collections.defaultdict(lambda: ([], []))
    for l in open(f"{out}/{mode}.txt"):
        f = l.split()
        if not f or f[0].startswith('#') or not f[0].isdigit():
            continue
        d[int(f[0])][0].append(float(f[5])); d[int(f[0])][1].append(float(f[7]))
    return d
off, psk = rows("off"), rows("psk")
print("| size | plaintext | encrypted (psk) | encrypted / plaintext |")
print("|---|---|---|---|")
for size in sorted(off):
    if size <= 8:
        a, b = st.median(off[size][0]), st.median(psk[size][0])
        print(f"| {size} B latency (µs) | {a:.2f} | {b:.2f} | {b/a:.2f}× time |")
    else:
        a, b = st.median(off[size][1]), st.median(psk[size][1])
        name = f"{size>>20} MiB" if size >= 1<<20 else f"{size>>10} KiB"
        print(f"| {name} busbw (GB/s) | {a:.2f} | {b:.2f} | {b/a:.2f}× |")
PY
