#!/usr/bin/env python3
"""Time whole commands from a Python caller, interleaved.

    scripts/bench-whole.py [-n ROUNDS] [-w WARMUP] NAME='CMD ...' NAME='CMD ...' ...

Each round runs every command once, in the order given, so that machine noise hits
them alike; each command is run with subprocess.run (no shell: CMD is split with
shlex), stdout and stderr discarded, and must exit 0. It prints, per command, p50 and
p95 of the wall time in milliseconds and the ratio of its p50 to the first command's.
This is how an agent framework written in Python (hermes-agent, for one) pays for a
call: process start included.

Example (a warm local session against the host's own shell):

    berth exec -s bench -- true   # once, to create the session's sandbox
    scripts/bench-whole.py -n 40 sh='sh -c true' berth='berth exec -s bench -- true'
"""

import argparse
import shlex
import subprocess
import sys
import time


def percentile(sorted_values, q):
    """The q-th percentile (0..100) by the nearest-rank method."""
    if not sorted_values:
        raise ValueError("no values")
    k = max(0, min(len(sorted_values) - 1, int(round(q / 100.0 * len(sorted_values) + 0.5)) - 1))
    return sorted_values[k]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", "--rounds", type=int, default=30, help="timed rounds (at least 30 for quoted numbers)")
    ap.add_argument("-w", "--warmup", type=int, default=3, help="untimed rounds first")
    ap.add_argument("commands", nargs="+", metavar="NAME=CMD")
    args = ap.parse_args()
    cmds = []
    for spec in args.commands:
        name, sep, cmd = spec.partition("=")
        if not sep or not name or not cmd.strip():
            ap.error("%r: want NAME='CMD ...'" % spec)
        cmds.append((name, shlex.split(cmd)))
    times = {name: [] for name, _ in cmds}
    for r in range(args.warmup + args.rounds):
        for name, argv in cmds:
            t0 = time.perf_counter()
            p = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            dt = (time.perf_counter() - t0) * 1000.0
            if p.returncode != 0:
                sys.exit("%s: %s exited %d; run it by hand to see why" % (name, shlex.join(argv), p.returncode))
            if r >= args.warmup:
                times[name].append(dt)
    base = None
    print("%-16s %9s %9s %8s" % ("command", "p50 ms", "p95 ms", "x first"))
    for name, _ in cmds:
        v = sorted(times[name])
        p50, p95 = percentile(v, 50), percentile(v, 95)
        if base is None:
            base = p50
        print("%-16s %9.2f %9.2f %8.2f" % (name, p50, p95, p50 / base))
    print("(%d interleaved rounds after %d warm-up rounds)" % (args.rounds, args.warmup))


if __name__ == "__main__":
    main()
