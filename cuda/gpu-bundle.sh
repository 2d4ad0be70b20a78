#!/usr/bin/env bash
# gpu-bundle.sh - build, on a machine with Rust (no GPU needed), everything cuda/gpu-check.sh runs
# on a GPU machine that has no Rust toolchain: the release libnccl.so.2, oxccl-perf, the device
# test binary, and the precompiled kernels. Output: target/gpu-bundle/ (carry it with the call).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
B=target/gpu-bundle
rm -rf "$B"; mkdir -p "$B"
cargo build --release -q -p oxccl-ffi -p oxccl-bench
test_bin=$(cargo test --release -q -p oxccl-cuda --test device --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "device":
        print(m["executable"])')
cp target/release/libnccl.so "$B/libnccl.so.2"
cp target/release/oxccl-perf "$B/"
cp "$test_bin" "$B/device-test"
strip "$B/libnccl.so.2" "$B/oxccl-perf" "$B/device-test"
du -sh "$B"
