#!/usr/bin/env python3
"""Benchmarks of the Python SDK against a running berth serve (docs/python.md).

1. ``session.exec(["true"])`` in a warm docker session against
   ``subprocess.run(["docker", "exec", C, "true"])`` on that session's own
   container, interleaved, ROUNDS rounds (>= 30): p50, p95 and the ratio at p50.
2. 50 threads x 20 calls across 10 sessions through one Client: errors, p50/p95
   of a call, wall time.

Usage (a daemon whose rule for ``SESSION``'s name runs docker, e.g. ``scope "*"
{ driver = "docker" image = "..." }``; DOCKER_HOST set for the docker CLI)::

    PYTHONPATH=clients/python/src python3 clients/python/bench/bench_exec.py \\
        [--rounds 40] [--session bench:docker] [--threads-prefix bench:t]

It prints the load average before and after, since the machine's load moves
the numbers.
"""

import argparse
import os
import subprocess
import sys
import threading
import time
from typing import List

import berth


def pct(xs: List[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(p / 100.0 * (len(s) - 1))))]


def ms(x: float) -> str:
    return "%.2f ms" % (x * 1000)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--session", default="bench:docker")
    ap.add_argument("--threads-prefix", default="bench:t")
    ap.add_argument("--skip-threads", action="store_true")
    ap.add_argument("--settle", type=float, default=0.0,
                    help="seconds to pause, untimed, before each measured call (e.g. 0.05): docker exec's "
                    "own clean-up goes on after it returns and otherwise lands in the next call's time")
    a = ap.parse_args()
    if a.rounds < 30:
        ap.error("--rounds: at least 30")
    c = berth.Client()
    s = c.session(a.session)
    first = s.exec(["true"])  # warm: the sandbox exists and runs
    print("load average before: %s" % " ".join("%.2f" % x for x in os.getloadavg()))
    print("session %s on %s, container %s" % (a.session, first.driver, first.sandbox))
    if first.driver != "docker":
        print("warning: the session runs on %s, not docker" % first.driver, file=sys.stderr)
    docker = ["docker", "exec", first.sandbox, "true"]
    subprocess.run(docker, check=True)
    sdk, dex = [], []
    for _ in range(a.rounds):
        time.sleep(a.settle)
        t = time.perf_counter()
        r = s.exec(["true"])
        sdk.append(time.perf_counter() - t)
        assert r.exit_code == 0
        time.sleep(a.settle)
        t = time.perf_counter()
        subprocess.run(docker, check=True)
        dex.append(time.perf_counter() - t)
    print("%d interleaved rounds%s:" % (a.rounds, ", %.0f ms settle before each call" % (a.settle * 1000) if a.settle else ""))
    print("  sdk exec(['true'])       p50 %s  p95 %s" % (ms(pct(sdk, 50)), ms(pct(sdk, 95))))
    print("  docker exec C true       p50 %s  p95 %s" % (ms(pct(dex, 50)), ms(pct(dex, 95))))
    print("  ratio at p50: %.3fx (target <= 0.05x)" % (pct(sdk, 50) / pct(dex, 50)))
    print("load average after: %s" % " ".join("%.2f" % x for x in os.getloadavg()))
    if a.skip_threads:
        return 0
    names = ["%s-%d" % (a.threads_prefix, i) for i in range(10)]
    for n in names:
        c.session(n).exec(["true"])  # warm the 10 sessions' sandboxes
    lat: List[float] = []
    errs: List[str] = []
    lock = threading.Lock()

    def work(i: int) -> None:
        ss = c.session(names[i % 10])
        for k in range(20):
            t = time.perf_counter()
            try:
                r = ss.exec(["true"])
                ok = r.exit_code == 0
            except berth.Error as e:
                ok = False
                with lock:
                    errs.append(repr(e))
            d = time.perf_counter() - t
            with lock:
                lat.append(d)
                if not ok and not errs:
                    errs.append("exit %d" % r.exit_code)

    print("load average before threads: %s" % " ".join("%.2f" % x for x in os.getloadavg()))
    t0 = time.perf_counter()
    ts = [threading.Thread(target=work, args=(i,)) for i in range(50)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    wall = time.perf_counter() - t0
    print("50 threads x 20 calls across 10 sessions: %d calls, %d errors, wall %.2f s" % (len(lat), len(errs), wall))
    print("  per call p50 %s  p95 %s" % (ms(pct(lat, 50)), ms(pct(lat, 95))))
    print("load average after threads: %s" % " ".join("%.2f" % x for x in os.getloadavg()))
    for e in errs[:5]:
        print("  error:", e)
    for n in names:
        c.session(n).remove()
    return 1 if errs else 0


if __name__ == "__main__":
    sys.exit(main())
