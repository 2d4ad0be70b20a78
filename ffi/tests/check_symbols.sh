#!/usr/bin/env bash
# check_symbols.sh - every nccl*/pnccl* function that NCCL's libnccl.so.2 exports from its
# nccl.h must exist in ours. Downloads the nvidia-nccl-cu13 wheel of the NCCL version oxccl
# implements and reports (2.30.7; NCCL_WHEEL_VERSION to try another), cached, never committed.
# (NCCL 2.31 added nccl*Config variants of the collectives, which oxccl does not provide yet.)
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
VERSION="${NCCL_WHEEL_VERSION:-2.30.7}"
CACHE="${OXCCL_NCCL_WHEEL_CACHE:-$HOME/.cache/oxccl-nccl-wheel}/$VERSION"
mkdir -p "$CACHE"
if ! ls "$CACHE"/*.whl >/dev/null 2>&1; then
  "${PYTHON:-python3}" -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_18_x86_64 \
    --python-version 3.12 -d "$CACHE" "nvidia-nccl-cu13==$VERSION"
fi
WHEEL=$(ls "$CACHE"/*.whl | head -1)
REAL="$CACHE/libnccl.so.2"
if [ ! -f "$REAL" ]; then
  "${PYTHON:-python3}" - "$WHEEL" "$REAL" <<'PY'
import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
name = next(n for n in z.namelist() if n.endswith("lib/libnccl.so.2"))
open(sys.argv[2], "wb").write(z.read(name))
PY
fi
(cd "$ROOT" && cargo build --release -q -p oxccl-ffi)
OURS="$ROOT/target/release/libnccl.so"
# NCCL's functions declared in nccl.h (its header ships in the wheel too)
HDR=$("${PYTHON:-python3}" - "$WHEEL" <<'PY'
import sys, zipfile, re
z = zipfile.ZipFile(sys.argv[1])
h = z.read(next(n for n in z.namelist() if n.endswith("include/nccl.h"))).decode()
print(" ".join(sorted(set(re.findall(r"\b(p?nccl[A-Za-z0-9]+)\s*\(", h)))))
PY
)
real=$(nm -D --defined-only "$REAL" | awk '$2 ~ /[TW]/ {print $3}' | sort -u)
ours=$(nm -D --defined-only "$OURS" | awk '{print $3}' | sort -u)
missing=()
for f in $real; do
  case " $HDR " in *" $f "*) ;; *) continue ;; esac   # only what nccl.h declares
  grep -qx "$f" <<<"$ours" || missing+=("$f")
done
echo "NCCL $VERSION's library: $(wc -w <<<"$real") exported names; declared in its nccl.h: $(wc -w <<<"$HDR"); ours: $(wc -w <<<"$ours")"
if [ ${#missing[@]} -gt 0 ]; then echo "missing from oxccl's libnccl.so: ${missing[*]}"; exit 1; fi
echo "symbols: every function NCCL exports from nccl.h is exported by oxccl"
