#!/usr/bin/env bash
# compare.sh - oxccl-perf against Open MPI, MPICH, Gloo and the ideal shm probe, side by side on
# this machine, interleaved (every config once per round, REPS rounds), then bench/report.py
# writes bench/RESULTS.md and the SVG charts from the medians.
# Usage: bench/compare.sh [REPS=5] [SETS="shm tcp"]      (root: installs Open MPI/MPICH, uses netns)
# CONFIGS="oxccl-ag-shm-2 ompi-ag-shm-2 ..." bench/compare.sh 11: only those configurations (names
# as in run() below), for more rounds of the cells in doubt; prints each one's median and range
# per size and leaves bench/RESULTS.md alone.
# SETS may also name "ofi": oxccl's RDMA protocol over libfabric against oxccl's TCP and Open
# MPI's ofi MTL and TCP BTL on 2 and 4 namespace hosts; run alone, it replaces only its section
# of bench/RESULTS.md.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SHARED="${OXCCL_SHARED:-$ROOT/../shared}"
A="$SHARED/anchors"
OUT="${OUT:-${TMPDIR:-/tmp}/oxccl-compare}"
REPS="${1:-5}"
SETS="${2:-shm tcp}"
SIZES="${SIZES:-8,4K,64K,1M,16M,64M,256M}"
CONFIGS_ONLY="${CONFIGS:-}"
mkdir -p "$OUT"; rm -f "$OUT"/*.txt
# oxccl-perf runs a fixed number of iterations per size (as nccl-tests does), while the MPI and
# Gloo anchors pick theirs for 0.25 s per size: small sizes get many iterations, large ones few,
# so that latencies are not dominated by the first, cold iterations. Below 1 MiB oxccl-perf runs
# 20,000 iterations: with 1,000 a 2-rank 8 B row lasted 0.3 ms, and one stall of 7-12 ms (seen
# next to the VM's placement switches) multiplied its mean by 27-42, where the anchors' 0.25 s
# window shrinks such a stall to a few percent (bench/ANALYSIS.md, 2026-12-07)
SMALL="" LARGE="" SMALL_BYTES=""
for s in ${SIZES//,/ }; do
  case $s in *K) b=$(( ${s%K} << 10 ));; *M) b=$(( ${s%M} << 20 ));; *G) b=$(( ${s%G} << 30 ));; *) b=$s;; esac
  if [ "$b" -lt 1048576 ]; then SMALL="$SMALL${SMALL:+,}$s" SMALL_BYTES="$SMALL_BYTES $b"; else LARGE="$LARGE${LARGE:+,}$s"; fi
done
oxperf() { # oxccl-perf args (without sizes and iterations)
  if [ -n "$SMALL" ]; then "$PERF" "$@" -s "$SMALL" -n 20000 -w 200; fi
  if [ -n "$LARGE" ]; then "$PERF" "$@" -s "$LARGE" -n 20 -w 3; fi
}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# the perf profile (fat LTO, one codegen unit): what a shipped build should use (Cargo.toml)
(cd "$ROOT" && cargo build --profile perf -q -p oxccl-bench)
PERF="$ROOT/target/perf/oxccl-perf"
command -v mpicc.openmpi >/dev/null || apt-get install -y -qq openmpi-bin libopenmpi-dev >/dev/null
command -v mpicc.mpich >/dev/null || apt-get install -y -qq mpich libmpich-dev >/dev/null
command -v iperf3 >/dev/null || apt-get install -y -qq iperf3 >/dev/null
mpicc.openmpi -O2 "$A/mpi_allreduce_bench.c" -o "$OUT/mpi_bench"
mpicc.mpich -O2 "$A/mpi_allreduce_bench.c" -o "$OUT/mpi_bench.mpich"
mpicc.openmpi -O2 "$ROOT/bench/peers/mpi_colls_bench.c" -o "$OUT/mpi_colls"
gcc -O3 -march=native "$A/ideal_shm_allreduce.c" -o "$OUT/ideal"
gcc -O3 -march=native -pthread "$A/membw.c" -o "$OUT/membw"
VENV="${OXCCL_VENV:-$HOME/.cache/oxccl-venv}"
if ! "$VENV/bin/python" -c 'import torch' >/dev/null 2>&1; then
  python3 -m venv "$VENV" && "$VENV/bin/pip" install -q torch numpy
fi
PY="$VENV/bin/python"
MPIRUN="mpirun.openmpi --mca pml ob1"
NETNS_UP=0
cleanup() { [ "$NETNS_UP" = 1 ] && "$SHARED/netns/netns_down.sh" >/dev/null 2>&1 || true; }
netns() { [ "$NETNS_UP" = 1 ] || { "$SHARED/netns/netns_up.sh" -n 4 >/dev/null; NETNS_UP=1; }; } # 4 hosts, once
trap cleanup EXIT

mpi_netns() { # n: an MPMD command line with one rank per namespace host
  local n="$1" parts=() i
  for i in $(seq 1 "$n"); do
    parts+=("-np 1 ip netns exec cclt-h$i $OUT/mpi_bench -s $SIZES")
    [ "$i" -lt "$n" ] && parts+=(":")
  done
  echo "${parts[*]}"
}
floor_sizes() { # the exchanges bench/floor.py needs for the small sizes: S and S/2 bytes each way
  local b x out=""
  for b in $SMALL_BYTES; do
    for x in $b $(( b / 2 )); do [ "$x" -ge 8 ] && [ "$x" -le 65536 ] && out="$out $x"; done
  done
  echo "$out" | tr ' ' '\n' | sort -nu | tr '\n' ' '
}
hosts() { local n="$1" i s=""; for i in $(seq 1 "$n"); do s="$s${s:+,}cclt-h$i"; done; echo "$s"; }

run() { # config name -> one run
  local cfg="$1" n="${1##*-}"
  case "$cfg" in
    oxccl-shm-*) OXCCL_SOCKET_IFNAME=lo oxperf --np "$n" ;;
    oxccl-ag-shm-*) OXCCL_SOCKET_IFNAME=lo oxperf --np "$n" --coll allgather ;;
    oxccl-rs-shm-*) OXCCL_SOCKET_IFNAME=lo oxperf --np "$n" --coll reducescatter ;;
    oxccl-bc-shm-*) OXCCL_SOCKET_IFNAME=lo oxperf --np "$n" --coll broadcast ;;
    ompi-ag-shm-*) $MPIRUN --mca btl vader,self --oversubscribe -np "$n" "$OUT/mpi_colls" -c allgather -s "$SIZES" ;;
    ompi-rs-shm-*) $MPIRUN --mca btl vader,self --oversubscribe -np "$n" "$OUT/mpi_colls" -c reducescatter -s "$SIZES" ;;
    ompi-bc-shm-*) $MPIRUN --mca btl vader,self --oversubscribe -np "$n" "$OUT/mpi_colls" -c broadcast -s "$SIZES" ;;
    ompi-shm-*) $MPIRUN --mca btl vader,self --oversubscribe -np "$n" "$OUT/mpi_bench" -s "$SIZES" ;;
    mpich-shm-*) mpirun.mpich -np "$n" "$OUT/mpi_bench.mpich" -s "$SIZES" ;;
    gloo-lo-*) "$PY" "$A/gloo_allreduce_bench.py" --nproc "$n" --sizes "$SIZES" ;;
    gloo-ag-lo-*) "$PY" "$ROOT/bench/peers/gloo_colls_bench.py" -c allgather --nproc "$n" --sizes "$SIZES" ;;
    gloo-rs-lo-*) "$PY" "$ROOT/bench/peers/gloo_colls_bench.py" -c reducescatter --nproc "$n" --sizes "$SIZES" ;;
    gloo-bc-lo-*) "$PY" "$ROOT/bench/peers/gloo_colls_bench.py" -c broadcast --nproc "$n" --sizes "$SIZES" ;;
    ideal-shm-2) "$OUT/ideal" 256 ;;
    floor-shm-2) "$OUT/block_exchange" $(floor_sizes) ;;
    oxccl-tcp-*) OXCCL_SOCKET_IFNAME=cclt-br0 oxperf --np "$n" --netns "$(hosts "$n")" ;;
    oxccl-ofi-*) OXCCL_NET=ofi OXCCL_OFI_PROVIDER="tcp;ofi_rxm" OXCCL_SOCKET_IFNAME=cclt-br0 \
      oxperf --np "$n" --netns "$(hosts "$n")" ;;
    ompi-ofi-*)
      # shellcheck disable=SC2046
      PMIX_MCA_ptl_tcp_remote_connections=1 PMIX_MCA_ptl_tcp_if_include=cclt-br0 \
      mpirun.openmpi -x PMIX_MCA_ptl_tcp_remote_connections -x PMIX_MCA_ptl_tcp_if_include \
        --mca pml cm --mca mtl ofi --mca mtl_ofi_provider_include "tcp;ofi_rxm" --mca btl self \
        --oversubscribe $(mpi_netns "$n") ;;
    ompi-tcp-*)
      # shellcheck disable=SC2046
      PMIX_MCA_ptl_tcp_remote_connections=1 PMIX_MCA_ptl_tcp_if_include=cclt-br0 \
      $MPIRUN -x PMIX_MCA_ptl_tcp_remote_connections -x PMIX_MCA_ptl_tcp_if_include \
        --mca btl tcp,self --mca btl_tcp_if_include 10.213.0.0/24 --oversubscribe $(mpi_netns "$n") ;;
    gloo-tcp-*) "$PY" "$A/gloo_allreduce_bench.py" --nproc "$n" --sizes "$SIZES" --netns ;;
    iperf-tcp-2)
      ip netns exec cclt-h2 iperf3 -s -1 -B 10.213.0.2 >/dev/null 2>&1 & sleep 0.3
      ip netns exec cclt-h1 iperf3 -c 10.213.0.2 -t 3 | grep receiver; wait ;;
    membw) "$OUT/membw" 256 5 ;;
    *) echo "unknown config $cfg" >&2; return 2 ;;
  esac
}

CONFIGS=""
[ -z "$CONFIGS_ONLY" ] || SETS=""
for s in $SETS; do
  case "$s" in
    shm) CONFIGS="$CONFIGS membw oxccl-shm-2 ompi-shm-2 ideal-shm-2 gloo-lo-2 mpich-shm-2 floor-shm-2 oxccl-ag-shm-2 ompi-ag-shm-2 gloo-ag-lo-2 oxccl-rs-shm-2 ompi-rs-shm-2 gloo-rs-lo-2 oxccl-bc-shm-2 ompi-bc-shm-2 gloo-bc-lo-2 oxccl-shm-4 ompi-shm-4 mpich-shm-4 gloo-lo-4 oxccl-shm-8 ompi-shm-8 mpich-shm-8 gloo-lo-8" ;;
    tcp) CONFIGS="$CONFIGS iperf-tcp-2 oxccl-tcp-2 ompi-tcp-2 gloo-tcp-2 oxccl-tcp-4 ompi-tcp-4 gloo-tcp-4"
         netns ;;
    ofi) CONFIGS="$CONFIGS oxccl-ofi-2 oxccl-tcp-2 ompi-ofi-2 ompi-tcp-2 oxccl-ofi-4 oxccl-tcp-4 ompi-ofi-4 ompi-tcp-4"
         command -v fi_info >/dev/null || apt-get install -y -qq libfabric-bin >/dev/null
         netns ;;
  esac
done
if [ -n "$CONFIGS_ONLY" ]; then
  CONFIGS="$CONFIGS_ONLY"
  case "$CONFIGS" in *tcp*|*ofi*) netns ;; esac
fi
# the cache-line hand-off between the two cores before each round: on the VMs measured it
# switched between ~90 and ~380 ns as the hypervisor moved the cores, and the slots' copies
# with it (bench/RESULTS.md "Single copy where the kernel's copy is slow")
gcc -O2 "$ROOT/bench/probes/line_exchange.c" -o "$OUT/line_exchange"
gcc -O2 "$ROOT/bench/probes/block_exchange.c" -o "$OUT/block_exchange"
: > "$OUT/rounds.txt"
for rep in $(seq 1 "$REPS"); do
  echo "round $rep: line exchange $("$OUT/line_exchange" 100000 | awk '{print $4}') ns" | tee -a "$OUT/rounds.txt"
  for cfg in $CONFIGS; do
    echo "== round $rep $cfg"
    run "$cfg" > "$OUT/$cfg.run$rep.txt" 2>&1 || echo "   ($cfg failed, see $OUT/$cfg.run$rep.txt)"
  done
done
{ echo "- CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores"
  echo "- kernel $(uname -r), $(grep MemTotal /proc/meminfo | awk '{printf "%.0f GiB", $2/1048576}') memory"
  echo "- $(mpirun.openmpi --version 2>/dev/null | head -1); $(mpirun.mpich --version 2>/dev/null | grep -m1 Version | xargs); torch $("$PY" -c 'import torch; print(torch.__version__)')"
  echo "- date $(date -u +%F), $REPS interleaved rounds"
  echo "- cache-line hand-off before each round (ns): $(awk '{printf "%s%s", sep, $5; sep=", "}' "$OUT/rounds.txt")"; } > "$OUT/machine.txt"
if [ -n "$CONFIGS_ONLY" ]; then
  python3 "$ROOT/bench/report.py" --cells "$OUT"
  case "$CONFIGS" in *floor-shm-2*) python3 "$ROOT/bench/floor.py" "$OUT" ;; esac
else
  python3 "$ROOT/bench/report.py" "$OUT" "$ROOT/bench"
fi
