#!/usr/bin/env bash
# check_symbols.sh - oxccl's libnccl.so.2 against the real thing:
#  1. every symbol the newest nvidia-nccl-cu13 wheel's libnccl.so.2 exports is exported by ours
#     (the whole dynamic symbol table, not one header: a new NCCL release shows up as a failing
#     diff with the missing names);
#  2. every nccl*/pnccl* symbol that PyTorch's libtorch_cuda.so imports is exported by ours
#     (PYTHON's torch; skipped, and said so, if it has none);
#  3. the structs of ffi/include/nccl.h and nccl_device.h have the wheel headers' layouts (sizes,
#     offsets, initializers), compiled once against each (needs CUDA's cuda.h: CUDA_INCLUDE).
# The wheel is cached, never committed. NCCL_WHEEL_VERSION pins a version (default: the newest).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
PY="${PYTHON:-python3}"
VERSION="${NCCL_WHEEL_VERSION:-}"
if [ -z "$VERSION" ]; then
  VERSION=$("$PY" -m pip index versions nvidia-nccl-cu13 2>/dev/null | sed -n 's/^nvidia-nccl-cu13 (\(.*\))$/\1/p')
  [ -n "$VERSION" ] || { echo "could not learn the newest nvidia-nccl-cu13 version (set NCCL_WHEEL_VERSION)"; exit 1; }
fi
CACHE="${OXCCL_NCCL_WHEEL_CACHE:-$HOME/.cache/oxccl-nccl-wheel}/$VERSION"
mkdir -p "$CACHE"
if ! ls "$CACHE"/*.whl >/dev/null 2>&1; then
  for plat in manylinux_2_27_x86_64 manylinux_2_18_x86_64 manylinux_2_17_x86_64; do
    "$PY" -m pip download -q --no-deps --only-binary=:all: --platform "$plat" --python-version 3.12 -d "$CACHE" \
      "nvidia-nccl-cu13==$VERSION" 2>/dev/null && break
  done
fi
WHEEL=$(ls "$CACHE"/*.whl | head -1)
if [ ! -f "$CACHE/include/nccl.h" ]; then
  "$PY" - "$WHEEL" "$CACHE" <<'PY'
import sys, zipfile, os
z = zipfile.ZipFile(sys.argv[1])
for n in z.namelist():
    if n.endswith("lib/libnccl.so.2") or "/include/" in n:
        rel = "libnccl.so.2" if n.endswith("libnccl.so.2") else n[n.index("/include/") + 1:]
        os.makedirs(os.path.dirname(os.path.join(sys.argv[2], rel)) or sys.argv[2], exist_ok=True)
        open(os.path.join(sys.argv[2], rel), "wb").write(z.read(n))
PY
fi
(cd "$ROOT" && cargo build --release -q -p oxccl-ffi)
OURS="$ROOT/target/release/libnccl.so"
ours=$(nm -D --defined-only "$OURS" | awk '{print $3}' | sort -u)
real=$(nm -D --defined-only "$CACHE/libnccl.so.2" | awk '$2 ~ /[TWDBR]/ {print $3}' | sort -u)
missing=$(comm -23 <(echo "$real") <(echo "$ours"))
echo "NCCL $VERSION's libnccl.so.2 exports $(wc -l <<<"$real") symbols; oxccl's exports $(wc -l <<<"$ours")"
[ -z "$missing" ] || { echo "missing from oxccl's libnccl.so (NCCL $VERSION exports them):"; echo "$missing"; exit 1; }
echo "symbols: every symbol of NCCL $VERSION's libnccl.so.2 is exported by oxccl"

TORCH_LIB=$("$PY" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))' 2>/dev/null || true)
if [ -n "$TORCH_LIB" ] && [ -f "$TORCH_LIB/libtorch_cuda.so" ]; then
  imports=$(nm -D --undefined-only "$TORCH_LIB/libtorch_cuda.so" | awk '{print $2}' | grep -E '^p?nccl' | sed 's/@.*//' | sort -u)
  tmissing=$(comm -23 <(echo "$imports") <(echo "$ours"))
  [ -z "$tmissing" ] || { echo "missing from oxccl's libnccl.so (libtorch_cuda.so imports them):"; echo "$tmissing"; exit 1; }
  echo "symbols: all $(wc -l <<<"$imports") nccl symbols libtorch_cuda.so imports (torch $("$PY" -c 'import torch; print(torch.__version__)')) are exported"
else
  echo "symbols: no CUDA build of torch at $PY: libtorch_cuda.so's imports not checked"
fi

# layouts: one program compiled against NCCL's headers and against ours prints the same numbers
if [ -z "${CUDA_INCLUDE:-}" ] || [ ! -f "$CUDA_INCLUDE/cuda.h" ]; then
  echo "layouts: CUDA_INCLUDE (a folder with cuda.h) is not set: not checked"; exit 1
fi
T="${TMPDIR:-/tmp}/oxccl-layouts"
mkdir -p "$T/stub"
# the CUDA runtime types nccl.h takes; cuda.h (needed by nccl_device's headers) is CUDA's own
printf '#pragma once\n#include <stddef.h>\n#define CUDART_VERSION 12000\ntypedef struct CUstream_st* cudaStream_t;\ntypedef struct CUevent_st* cudaEvent_t;\n' > "$T/stub/cuda_runtime.h"
touch "$T/stub/cuda_fp16.h" "$T/stub/cuda_bf16.h" "$T/stub/cuda_fp8.h"
cat > "$T/layout.cc" <<'EOF'
#include <nccl.h>
#include DEVICE_HEADER
#include <cstddef>
#include <cstdio>
#define F(T, m) printf(#T "." #m " %zu\n", offsetof(T, m));
#define S(T) printf(#T " %zu\n", sizeof(T));
int main() {
  S(ncclConfig_t) F(ncclConfig_t, graphStreamOrdering) F(ncclConfig_t, nvlsHostMode)
  S(ncclCollConfig_t) F(ncclCollConfig_t, ext) F(ncclCollConfig_t, algSelection) F(ncclCollConfig_t, forceAlgSelection)
  F(ncclCollConfig_t, userProfilerTag) F(ncclCollConfig_t, launchCompletionEvent)
  S(ncclConfigExt_t) S(ncclEncryptionConfig_t) F(ncclEncryptionConfig_t, mode) F(ncclEncryptionConfig_t, psk)
  S(ncclSimInfo_t) S(ncclWaitSignalDesc_t) S(ncclUniqueId)
  S(ncclCommProperties_t) F(ncclCommProperties_t, deviceApiSupport) F(ncclCommProperties_t, ginType)
  F(ncclCommProperties_t, nLsaTeams) F(ncclCommProperties_t, commHash) F(ncclCommProperties_t, ginSupport)
  F(ncclCommProperties_t, devCommRuntimeVersionSize) F(ncclCommProperties_t, cftCountedSupport)
  S(ncclDevCommRequirements_t) F(ncclDevCommRequirements_t, lsaMultimem) F(ncclDevCommRequirements_t, ginConnectionType)
  F(ncclDevCommRequirements_t, ginType) F(ncclDevCommRequirements_t, cftBarrierCount)
  S(ncclDevResourceRequirements_t) S(ncclTeamRequirements_t) S(ncclTeam_t) S(ncclMultimemHandle_t)
  S(ncclLsaBarrierHandle_t) S(ncclGinBarrierHandle_t) S(ncclCftBarrierHandle_t) S(ncclLLA2AHandle_t)
  ncclConfig_t c = NCCL_CONFIG_INITIALIZER;
  ncclCollConfig_t k = NCCL_COLLCONFIG_INITIALIZER;
  ncclEncryptionConfig_t e = NCCL_ENCRYPTION_CONFIG_INITIALIZER;
  ncclDevCommRequirements_t r = NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER;
  ncclCommProperties_t p = NCCL_COMM_PROPERTIES_INITIALIZER;
  printf("init %zu %d %d %d %d %zu %d %d %d %d %d %d\n", c.size, k.forceAlgSelection,
         c.nvlsHostMode, e.mode, r.ginContextCount, p.size, r.ginCustomStride, (int)r.ginStrongSignalsRequired,
         r.ginTrafficClass, (int)r.ginType, k.minCTAs, (int)k.userProfilerTag);
  return 0;
}
EOF
c++ -std=c++17 -DDEVICE_HEADER='<nccl_device/host.h>' -I"$T/stub" -I"$CACHE/include" -I"$CUDA_INCLUDE" "$T/layout.cc" -o "$T/real"
c++ -std=c++17 -DDEVICE_HEADER='<nccl_device.h>' -I"$ROOT/ffi/include" "$T/layout.cc" -o "$T/ours"
"$T/real" > "$T/real.txt"
"$T/ours" > "$T/ours.txt"
diff "$T/real.txt" "$T/ours.txt" || { echo "layouts differ from NCCL $VERSION's headers (< NCCL, > oxccl)"; exit 1; }
echo "layouts: $(wc -l <"$T/ours.txt") sizes, offsets and initializers equal NCCL $VERSION's headers"
