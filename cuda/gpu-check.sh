#!/usr/bin/env bash
# gpu-check.sh - oxccl's device checks, in one run on a GPU machine (H200 lent by the device tool:
# CUDA driver, nvcc and PyTorch, no Rust, no network). Prepare the bundle first, where Rust is:
#     cuda/gpu-bundle.sh            # -> target/gpu-bundle (carried with the call)
# then, on the GPU machine, from the repository root:
#     cuda/gpu-check.sh [BUNDLE]    # default target/gpu-bundle
# It runs the device tests (every collective, type and op on 1, 2 and 4 ranks sharing GPU 0, bit
# for bit), the C ABI collective tests on device buffers (forked ranks: real CUDA IPC between
# processes), oxccl-perf on device buffers with 2 and 4 ranks (with device memcpy and
# reduce-kernel bandwidth measured in the same run), and a PyTorch DDP step on CUDA tensors over
# the oxccl backend and over ProcessGroupNCCL with oxccl's libnccl.so.2 in LD_PRELOAD. Each step
# is time-boxed (550 s in all at worst; a few minutes normally); a summary table comes last, and
# the exit status is non-zero if a step failed.
#
# OXCCL_GPU_CHECK_SIM=<folder of the simulated libcuda.so.1> (target/release/cuda-sim) runs the
# correctness part under oxccl's simulated CUDA driver instead, with CUDA_HOME's headers (a folder
# with include/cuda.h; CUDA_EXTRA_INCLUDE for crt/host_config.h where that is elsewhere):
# everything but the PyTorch steps, whose CUDA runtime needs a real driver.
# Its times and bandwidths are the simulator's (oxccl-perf labels them SIMULATED).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
B="$(cd "${1:-$ROOT/target/gpu-bundle}" && pwd)"
OUT="${OUT:-/tmp/oxccl-gpu-check}"
mkdir -p "$OUT"
export NCCL_SOCKET_IFNAME=lo OXCCL_TIMEOUT=60 XDG_CACHE_HOME="$OUT/cache"
NAMES=()
RESULTS=()
step() { # step NAME SECONDS CMD...
  local name=$1 secs=$2; shift 2
  echo; echo "=== $name"
  local t0=$SECONDS
  timeout --kill-after=5 "$secs" "$@" 2>&1 | tee "$OUT/step${#NAMES[@]}.log"
  local rc=${PIPESTATUS[0]}
  NAMES+=("$name"); RESULTS+=("$( [ "$rc" = 0 ] && echo PASS || echo "FAIL(rc=$rc)" ) $((SECONDS - t0))s")
}
SIM="${OXCCL_GPU_CHECK_SIM:-}"
if [ -n "$SIM" ]; then
  echo "SIMULATED CUDA driver ($SIM): correctness only, no GPU figures" | tee "$OUT/gpu.txt"
  export LD_LIBRARY_PATH="$SIM${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$OUT/gpu.txt"
fi
CUDA_HOME="${CUDA_HOME:-$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")")}"
# NVRTC: the toolkit's, else PyTorch's wheel; without either the embedded PTX is used
for d in "$CUDA_HOME/lib64" $(python3 -c 'import nvidia.cuda_nvrtc, os; print(os.path.dirname(nvidia.cuda_nvrtc.__file__) + "/lib")' 2>/dev/null); do
  [ -e "$d/libnvrtc.so" ] || ls "$d"/libnvrtc.so.* >/dev/null 2>&1 && { export OXCCL_NVRTC_DIR="$d"; break; }
done
echo "CUDA_HOME=$CUDA_HOME OXCCL_NVRTC_DIR=${OXCCL_NVRTC_DIR:-none}"

# the torch backend's C++ part compiles (about a minute) while the steps below run; the PyTorch
# steps wait for it
export PYTHONPATH="$ROOT/ffi/python${PYTHONPATH:+:$PYTHONPATH}" OXCCL_LIBRARY="$B/libnccl.so.2"
export OXCCL_TORCH_EXT_DIR="${OXCCL_TORCH_EXT_DIR:-$OUT/torch-ext}"
if [ -z "$SIM" ]; then
  rm -f "$OUT/ext-build.rc"
  (timeout 240 python3 -c 'from oxccl import _ext; print(_ext.load())' > "$OUT/ext-build.log" 2>&1
   echo $? > "$OUT/ext-build.rc") &
fi

step "device tests: 1, 2, 4 ranks on one GPU, every collective/type/op" 60 \
  env OXCCL_REQUIRE_GPU=1 OXCCL_DEVICE_TEST_RANKS=1,2,4 "$B/device-test" --nocapture --test-threads 1

# PyTorch next (the checks most likely to hang): a hang names itself (OXCCL_TIMEOUT), prints
# the Python stacks (gpu_ddp.py), and cuda-gdb writes every thread's native stack to stacks.log
stacks() { # stacks SECONDS: in the background, the native stacks of gpu_ddp.py's ranks then
  command -v cuda-gdb >/dev/null || return 0
  (sleep "$1"; for p in $(pgrep -f gpu_ddp.py); do
     echo "=== pid $p"; timeout 25 cuda-gdb -q -batch -p "$p" -ex "thread apply all bt 14" 2>&1 | grep -E "^Thread|^#"
   done >> "$OUT/stacks.log") &
  STACKS=$!
}
export OXCCL_TIMEOUT=25 STACKS=
if [ -z "$SIM" ]; then
  step "PyTorch: the oxccl backend's C++ part, built against this torch" 150 \
    bash -c 'while [ ! -e "$1" ]; do sleep 1; done; cat "$2"; exit "$(cat "$1")"' _ "$OUT/ext-build.rc" "$OUT/ext-build.log"
  stacks 33
  step "PyTorch DDP, CUDA tensors, oxccl backend (2 ranks)" 60 \
    python3 -m torch.distributed.run --nproc-per-node 2 --master-port 29571 "$ROOT/cuda/gpu_ddp.py" --backend oxccl
  kill "$STACKS" 2>/dev/null
  stacks 33
  step "PyTorch DDP, CUDA tensors, ProcessGroupNCCL + LD_PRELOAD libnccl.so.2 (2 ranks)" 60 \
    env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT LD_PRELOAD="$B/libnccl.so.2" \
    python3 -m torch.distributed.run --nproc-per-node 2 --master-port 29572 "$ROOT/cuda/gpu_ddp.py" --backend nccl
  kill "$STACKS" 2>/dev/null
fi
export OXCCL_TIMEOUT=60

step "C ABI on device buffers: build" 20 \
  cc -std=c11 -O2 -DOXCCL_DEVICE -I"$ROOT/ffi/include" -I"$CUDA_HOME/include" \
  ${CUDA_EXTRA_INCLUDE:+-I"$CUDA_EXTRA_INCLUDE"} "$ROOT/ffi/tests/c/colls.c" \
  -o "$OUT/colls_dev" -L"$B" -l:libnccl.so.2 ${SIM:+-L"$SIM"} -L"$CUDA_HOME/lib64" -L"$CUDA_HOME/lib64/stubs" -lcuda -lm \
  -Wl,-rpath,"$B"
step "C ABI on device buffers: 2 processes (CUDA IPC)" 30 "$OUT/colls_dev" 2
step "C ABI on device buffers: 4 processes (CUDA IPC)" 40 "$OUT/colls_dev" 4

# the simulator's kernels run on one host thread: smaller sizes there
MAX=${SIM:+16M}; MAX=${MAX:-256M}
step "oxccl-perf --device, 2 ranks, all-reduce 8 B..$MAX" 40 \
  "$B/oxccl-perf" --device --np 2 -b 8 -e "$MAX" -f 4 -n 20 -w 5 -c 1
step "oxccl-perf --device, 4 ranks, all-reduce 8 B..$MAX" 40 \
  "$B/oxccl-perf" --device --np 4 -b 8 -e "$MAX" -f 4 -n 20 -w 5 -c 1
SMAX=${SIM:+4M}; SMAX=${SMAX:-64M}
step "oxccl-perf --device, 2 ranks, staged (OXCCL_CUDA_IPC=0) 8 B..$SMAX" 30 \
  env OXCCL_CUDA_IPC=0 "$B/oxccl-perf" --device --np 2 -b 8 -e "$SMAX" -f 8 -n 10 -w 2 -c 1
step "oxccl-perf --device, 2 ranks, 8 B latency and where the worker's time goes" 20 \
  "$B/oxccl-perf" --device --np 2 -b 8 -e 8 -n 500 -w 50 -c 1

echo; echo "=== summary ($(date -u +%F), $(cat "$OUT/gpu.txt" | head -1))"
printf '| %-80s | %-16s |\n' "check" "result"
for i in "${!NAMES[@]}"; do printf '| %-80s | %-16s |\n' "${NAMES[$i]}" "${RESULTS[$i]}"; done
[ -s "$OUT/stacks.log" ] && { echo "native stacks of a hung PyTorch step: $OUT/stacks.log"; grep -c "^Thread" "$OUT/stacks.log"; }
grep -h "^# Device" "$OUT"/step*.log | head -8
grep -h -E "^ +268435456 " "$OUT"/step*.log | head -3
for r in "${RESULTS[@]}"; do case "$r" in PASS*) ;; *) exit 1 ;; esac; done
