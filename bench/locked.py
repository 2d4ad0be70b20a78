"""locked.py A B CALLS LOCKED: the locked instructions per call between two callgrind profiles
(`--dump-instr=yes`) of the same binary, A with fewer calls than B by CALLS; LOCKED lists the
binary's locked instructions (hex addresses, one per line). Prints the total, then each
instruction's count per call and address, most first (bench/lockcount.sh names them)."""
import collections
import sys


def self_costs(path):
    """Instructions executed per address (self cost, calls' inclusive lines left out)."""
    counts = collections.Counter()
    npos, prev, after_call = 1, [0], False
    with open(path) as f:
        for line in f:
            if line.startswith("positions:"):
                npos = len(line.split()) - 1
                prev = [0] * npos
                continue
            if line.startswith("calls="):
                after_call = True
                continue
            if not line[:1] or not (line[0].isdigit() or line[0] in "+-*"):
                continue
            parts = line.split()
            pos = []
            for i in range(npos):
                p = parts[i]
                if p == "*":
                    pos.append(prev[i])
                elif p[0] in "+-":
                    pos.append(prev[i] + int(p, 0))
                else:
                    pos.append(int(p, 0))
            prev = pos
            if after_call:
                after_call = False
                continue
            counts[pos[0]] += int(parts[npos]) if len(parts) > npos else 0
    return counts


def main():
    a, b = self_costs(sys.argv[1]), self_costs(sys.argv[2])
    calls = int(sys.argv[3])
    locked = {int(x, 16) for x in open(sys.argv[4]).read().split()}
    rows = sorted(((b[x] - a[x]) / calls, x) for x in locked if b[x] > a[x])
    rows = [(n, x) for n, x in rows if n >= 0.05]
    print("%.1f locked-instructions-per-call" % sum(n for n, _ in rows))
    for n, x in reversed(rows):
        print("%.2f 0x%x" % (n, x))


main()
