#!/usr/bin/env bash
# readme.sh - follow README.md's Getting Started as a new user would: every code block marked
# <!-- ci:file PATH --> must equal PATH (the example a reader pastes is the one that is built),
# and every sh block marked <!-- ci:run --> runs exactly as written, from the repository root.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 - <<'PY'
import re, subprocess, sys
text = open("README.md").read()
blocks = re.findall(r"<!-- ci:(file|run)\s*([^>]*?)\s*-->\n```[a-z]*\n(.*?)```", text, re.S)
if not blocks:
    sys.exit("README.md has no <!-- ci: --> blocks")
ran = 0
for kind, arg, body in blocks:
    if kind == "file":
        have = open(arg).read()
        if have != body:
            sys.exit(f"README.md's copy of {arg} differs from the file")
        print(f"readme: {arg} is the file README.md shows")
    else:
        print("readme: running\n" + body, flush=True)
        subprocess.run(["bash", "-euo", "pipefail", "-c", body], check=True, timeout=900)
        ran += 1
print(f"readme: {ran} documented command blocks ran")
PY
