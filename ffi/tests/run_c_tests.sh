#!/usr/bin/env bash
# run_c_tests.sh - build oxccl's libnccl.so.2, compile the C tests against ffi/include/nccl.h with
# cc (C and C++, with and without CUDA headers in the way), run them, then run them again under
# AddressSanitizer and Valgrind. Usage: ffi/tests/run_c_tests.sh [--no-sanitizers]
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
OUT="${OUT:-${TMPDIR:-/tmp}/oxccl-c-tests}"
mkdir -p "$OUT"
(cd "$ROOT" && cargo build --release -q -p oxccl-ffi)
LIB="$ROOT/target/release"
test -L "$LIB/libnccl.so.2" -o -f "$LIB/libnccl.so.2" || { echo "no libnccl.so.2 beside libnccl.so"; exit 1; }
readelf -d "$LIB/libnccl.so" | grep -q 'SONAME.*libnccl.so.2' || { echo "SONAME is not libnccl.so.2"; exit 1; }
# only nccl*/pnccl* (NCCL's API) and oxccl* (oxccl's own entry points, ffi/src/oxccl_ext.rs)
# are exported: nothing of Rust's leaks into the symbol table
bad=$(nm -D --defined-only "$LIB/libnccl.so" | awk '{print $3}' | grep -v -E '^(p?nccl|oxccl)' || true)
[ -z "$bad" ] || { echo "exports beyond nccl*/pnccl*/oxccl*: $bad"; exit 1; }
INC="$ROOT/ffi/include"
CFLAGS=(-O1 -g -Wall -Wextra -Werror -Wno-unused-parameter -Wno-sign-compare -Wno-missing-field-initializers)
# the header alone, in C and C++, with and without CUDA headers
printf '#include <nccl.h>\n#include <nccl_device.h>\nint main(void){ncclConfig_t c = NCCL_CONFIG_INITIALIZER; ncclCollConfig_t k = NCCL_COLLCONFIG_INITIALIZER; ncclCommProperties_t p = NCCL_COMM_PROPERTIES_INITIALIZER; ncclDevCommRequirements_t q = NCCL_DEV_COMM_REQUIREMENTS_INITIALIZER; ncclEncryptionConfig_t e = NCCL_ENCRYPTION_CONFIG_INITIALIZER; return c.magic != k.magic || p.magic != q.magic || e.magic != NCCL_API_MAGIC;}\n' > "$OUT/hdr.c"
cc -std=c99 "${CFLAGS[@]}" -I"$INC" "$OUT/hdr.c" -o "$OUT/hdr_c"
cc -std=c11 "${CFLAGS[@]}" -DOXCCL_NO_CUDA_HEADERS -I"$INC" "$OUT/hdr.c" -o "$OUT/hdr_c_nocuda"
if command -v c++ >/dev/null; then
  cp "$OUT/hdr.c" "$OUT/hdr.cc"
  c++ -std=c++17 "${CFLAGS[@]}" -I"$INC" "$OUT/hdr.cc" -o "$OUT/hdr_cxx"
fi
# a stand-in <cuda_runtime.h> that defines cudaStream_t the way CUDA does
mkdir -p "$OUT/fakecuda"
printf 'typedef struct CUstream_st* cudaStream_t;\ntypedef struct CUevent_st* cudaEvent_t;\n' > "$OUT/fakecuda/cuda_runtime.h"
cc -std=c11 "${CFLAGS[@]}" -I"$OUT/fakecuda" -I"$INC" "$OUT/hdr.c" -o "$OUT/hdr_c_cuda"
build() { # name, extra flags
  local name="$1"; shift
  cc -std=gnu11 "${CFLAGS[@]}" "$@" -I"$INC" "$ROOT/ffi/tests/c/$name.c" -o "$OUT/$name$SUFFIX" \
    -L"$LIB" -Wl,-rpath,"$LIB" -lnccl -lpthread -lm
}
run_all() {
  "$OUT/colls$SUFFIX" 3
  "$OUT/groups$SUFFIX" 4
  "$OUT/badargs$SUFFIX"
  "$OUT/collconfig$SUFFIX" 3
  "$OUT/lifetimes$SUFFIX" 3
  NCCL_SHM_DISABLE=1 "$OUT/lifetimes$SUFFIX" 2
  # fork: no Rust panic may reach stderr (it did, from a store server adopted across fork).
  # Not under AddressSanitizer: its allocator is not fork-safe while other threads allocate
  # (a child can inherit its lock held and deadlock); Valgrind runs it below.
  if [ "$SUFFIX" != .asan ]; then
    "$OUT/fork$SUFFIX" 3 2>"$OUT/fork.err" || { cat "$OUT/fork.err"; exit 1; }
    if grep -E "panicked|should not terminate|failed to join" "$OUT/fork.err"; then exit 1; fi
    # kill -9, shrink, grow with a new process; revoke; suspend (forks after threads exist, too)
    "$OUT/elastic$SUFFIX"
  fi
}
TESTS=(colls groups badargs collconfig fork lifetimes elastic)
export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-lo}"
SUFFIX="" ; for t in "${TESTS[@]}"; do build $t; done
echo "== C tests"; run_all
# the per-call algorithm selection changes the algorithm used, as NCCL_DEBUG=INFO shows (the
# TUNING subsystem, as in NCCL)
NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING "$OUT/collconfig" 2 2>"$OUT/collconfig.log" >/dev/null || { cat "$OUT/collconfig.log"; exit 1; }
auto=$(grep -m1 -o 'allreduce of 16384 bytes uses [a-z]*$' "$OUT/collconfig.log" | awk '{print $NF}')
grep -q 'allreduce of 16384 bytes uses tree (algSelection tree)' "$OUT/collconfig.log" \
  && grep -q 'allreduce of 16384 bytes uses ring (algSelection ring)' "$OUT/collconfig.log" \
  && [ -n "$auto" ] && [ "$auto" != tree ] \
  || { echo "algSelection did not change the algorithm (automatic: '$auto')"; cat "$OUT/collconfig.log"; exit 1; }
echo "algSelection: automatic allreduce uses $auto; algSelection=tree uses tree; ring uses ring"
if [ "${1:-}" != "--no-sanitizers" ]; then
  # AddressSanitizer on the C side (the Rust library is not instrumented; Valgrind covers it)
  SUFFIX=".asan"; for t in "${TESTS[@]}"; do build $t -fsanitize=address,undefined -fno-omit-frame-pointer; done
  echo "== C tests under AddressSanitizer"
  ASAN_OPTIONS=detect_leaks=0 run_all
  if ! command -v valgrind >/dev/null; then apt-get install -y -qq valgrind >/dev/null; fi
  SUFFIX=""
  echo "== C tests under Valgrind (memcheck, errors fail the run)"
  # --fair-sched: Valgrind runs one thread at a time, and its default lock lets a polling
  # thread starve the one it waits for
  VG=(valgrind -q --error-exitcode=9 --fair-sched=yes --trace-children=yes --child-silent-after-fork=no)
  "${VG[@]}" "$OUT/badargs"
  "${VG[@]}" "$OUT/groups" 2
  "${VG[@]}" "$OUT/colls" 2 >/dev/null
  "${VG[@]}" "$OUT/collconfig" 2 >/dev/null 2>"$OUT/collconfig.vg.log" || { cat "$OUT/collconfig.vg.log"; exit 1; }
  "${VG[@]}" "$OUT/fork" 2 >/dev/null
  "${VG[@]}" "$OUT/elastic" >/dev/null
fi
echo "C tests: OK"
