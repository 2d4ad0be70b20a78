"""Compares a run of PyTorch's distributed suite on oxccl with one on gloo (junit XML files).

    python torch_suite_check.py GLOO.xml OXCCL.xml torch_suite_expected.txt

Fails when a test that passed on gloo did not pass on oxccl and is not in the expected list, or
when a listed test passed (the list must stay true). Each list line is ``test_name  reason``.
"""

import sys
import xml.etree.ElementTree as ET


def outcomes(path):
    out = {}
    for tc in ET.parse(path).getroot().iter("testcase"):
        state, msg = "pass", ""
        for child in tc:
            if child.tag in ("failure", "error"):
                state, msg = "fail", (child.get("message") or "").splitlines()[:1]
            elif child.tag == "skipped":
                state, msg = "skip", [child.get("message") or ""]
        out[tc.get("name")] = (state, " ".join(msg)[:160])
    return out


def expected(path):
    listed = {}
    for line in open(path):
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, reason = line.partition(" ")
            if not reason.strip():
                sys.exit(f"{path}: {name} has no reason")
            listed[name] = reason.strip()
    return listed


def main(gloo, ox, listed_path):
    g, o, listed = outcomes(gloo), outcomes(ox), expected(listed_path)
    gloo_passed = sorted(n for n, (s, _) in g.items() if s == "pass")
    bad, stale, excused = [], [], []
    for name in gloo_passed:
        state, msg = o.get(name, ("missing", ""))
        if state == "pass":
            if name in listed:
                stale.append(name)
        elif name in listed:
            excused.append(name)
        else:
            bad.append(f"{name}: {state} on oxccl: {msg}")
    passed = sum(1 for n in gloo_passed if o.get(n, ("",))[0] == "pass")
    print(f"gloo passed {len(gloo_passed)}; oxccl passed {passed} of them; {len(excused)} listed as expected")
    for name in excused:
        print(f"  expected: {name}: {listed[name]}")
    for line in bad:
        print(f"UNEXPECTED: {line}")
    for name in stale:
        print(f"STALE (now passes, remove it from the list): {name}")
    return 1 if bad or stale else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
