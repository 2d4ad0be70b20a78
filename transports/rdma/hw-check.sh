#!/usr/bin/env bash
# hw-check.sh - oxccl's RDMA transport on machines that have RDMA hardware (InfiniBand, RoCE,
# EFA, Slingshot). Nothing here has run on such hardware yet (docs/transports.md); this is the
# script for the first machine that has it. Run on two hosts that reach each other:
#
#   transports/rdma/hw-check.sh probe                 # on each host: devices, providers, unit tests
#   transports/rdma/hw-check.sh run HOST0 HOST1 [PROVIDER]   # from HOST0: 2-rank collectives over libfabric
#   transports/rdma/hw-check.sh run HOST0 HOST1 ib           # the same over oxccl's verbs backend
#
# `probe` needs the repository built (cargo) on the host; `run` needs the same checkout and
# release build on both hosts at the same path, and passwordless ssh from HOST0 to HOST1.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
PERF="$ROOT/target/release/oxccl-perf"
cmd="${1:-probe}"

probe() {
  echo "== RDMA devices (sysfs)"; ls /sys/class/infiniband 2>/dev/null || echo "none"
  for d in /sys/class/infiniband/*/ports/*; do
    [ -e "$d/state" ] || continue
    echo "$d: $(cat "$d/state") $(cat "$d/link_layer" 2>/dev/null)"
    for g in "$d"/gids/*; do
      i=$(basename "$g"); v=$(cat "$g" 2>/dev/null) || continue
      [ "$v" = "0000:0000:0000:0000:0000:0000:0000:0000" ] && continue
      echo "   gid $i $v $(cat "$d/gid_attrs/types/$i" 2>/dev/null)"
    done
  done
  echo "== libfabric providers with RDM + RMA"
  command -v fi_info >/dev/null && fi_info -t FI_EP_RDM -c FI_RMA 2>&1 | grep -E "provider|domain" | paste - - | sort -u | head -20 \
    || echo "fi_info not installed (apt-get install libfabric-bin)"
  echo "== the verbs backend: layouts vs this machine's verbs.h, selection, simulated data path"
  (cd "$ROOT" && cargo test --release -q -p oxccl-transport-rdma verbs -- --nocapture)
  echo "== the verbs backend on this machine's device: 2 ranks on loopback (NCCL_SHM_DISABLE=1)"
  (cd "$ROOT" && OXCCL_NET=ib NCCL_SHM_DISABLE=1 OXCCL_DEBUG=INFO OXCCL_TIMEOUT=60 \
    "$PERF" --np 2 --coll all -d all -o all -b 8 -e 16M -f 16 -c 1 -n 2 -w 1 2>&1 | tail -25)
  if command -v nvidia-smi >/dev/null; then
    echo "== GPUDirect RDMA: device memory (dma-buf) registered and written by the adapter"
    (cd "$ROOT" && cargo test --release -q -p oxccl-cuda --test gpudirect -- --nocapture)
  fi
  echo "== the RDMA protocol over this machine's first hardware provider, on loopback"
  prov=$(fi_info -t FI_EP_RDM -c FI_RMA 2>/dev/null | awk '/provider:/ {print $2}' | grep -v -E '^(tcp|sockets|udp|shm)' | head -1)
  if [ -n "$prov" ]; then
    echo "provider $prov"
    (cd "$ROOT" && OXCCL_REQUIRE_OFI=1 OXCCL_TEST_PROVIDER="$prov" cargo test --release -q -p oxccl-transport-rdma)
  else
    echo "no hardware provider: libfabric only offers software emulations here"
  fi
}

run2() { # HOST0 HOST1 PROVIDER
  local h0=$1 h1=$2 prov=${3:-}
  local env="OXCCL_NET=ofi OXCCL_OFI_PROVIDER=$prov OXCCL_TIMEOUT=120 OXCCL_DEBUG=INFO"
  [ "$prov" = ib ] && env="OXCCL_NET=ib OXCCL_TIMEOUT=120 OXCCL_DEBUG=INFO"
  # rank 1 on HOST1 over ssh, rank 0 here; rank 0 serves the store at MASTER_ADDR:MASTER_PORT
  local port=$((20000 + RANDOM % 10000))
  local launch="MASTER_ADDR=$h0 MASTER_PORT=$port WORLD_SIZE=2"
  ssh "$h1" "cd $ROOT && env $env $launch RANK=1 $PERF --coll all -d all -o all -b 8 -e 64M -f 8 -c 1" &
  env $env $launch RANK=0 "$PERF" --coll all -d all -o all -b 8 -e 64M -f 8 -c 1
  local rc=$?
  wait || rc=1
  return $rc
}

case "$cmd" in
  probe) probe ;;
  run) [ $# -ge 3 ] || { echo "usage: $0 run HOST0 HOST1 [PROVIDER]"; exit 2; }; run2 "$2" "$3" "${4:-}" ;;
  *) echo "usage: $0 probe | run HOST0 HOST1 [PROVIDER]"; exit 2 ;;
esac
