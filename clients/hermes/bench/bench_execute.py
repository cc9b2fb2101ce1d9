"""Benchmark: the berth hermes backend's execute("true") in a warm docker session
vs ``docker exec C true`` on a plain container, from the same Python process,
interleaved round by round; prints p50/p95 of each (ms) and their ratio. Then, in
the same session, the wall time of --parallel calls of ``--parallel-command`` made at
once from as many threads (hermes's parallel tools, sub-agents sharing a session)
against one such call alone, interleaved, and their ratio.

    source /tmp/runtimes.env          # DOCKER_HOST
    berth serve &                     # with a config whose hermes:* rule is docker
    python3 clients/hermes/bench/bench_execute.py [--rounds 50] [--image berth-test/busybox:1]

hermes's own docker backend (tools/environments/docker.py) runs each command as
``docker exec`` of a bash wrapper and cannot be loaded here (its imports need
more of hermes than this machine has), so the plain ``docker exec`` stands in for
it: a lower bound of what hermes's own path costs.
"""

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "src"), os.path.join(HERE, "..", "..", "python", "src")]

import berth_hermes  # noqa: E402


def pct(xs, p):
    xs = sorted(xs)
    k = max(0, min(len(xs) - 1, int(round(p / 100.0 * (len(xs) - 1)))))
    return xs[k]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--image", default="berth-test/busybox:1")
    ap.add_argument("--task", default="bench")
    ap.add_argument("--settle", type=float, default=0.0,
                    help="seconds to pause, untimed, before each measured call (e.g. 0.05): docker exec's "
                    "own clean-up goes on after it returns and otherwise lands in the next call's time")
    ap.add_argument("--parallel", type=int, default=8, help="calls made at once on the one session (0: skip)")
    ap.add_argument("--parallel-command", default="sleep 0.5", help="what each of those calls runs")
    a = ap.parse_args()
    if a.rounds < 30:
        sys.exit("--rounds: at least 30")
    env = berth_hermes.BerthTerminalProvider().create_environment(cwd="", timeout=60, task_id=a.task)
    name = "bh-bench-%d" % os.getpid()
    subprocess.run(["docker", "run", "-d", "--name", name, "--network", "none", a.image, "sleep", "3600"], check=True, capture_output=True)
    try:
        env.execute("true")  # warm: the sandbox exists and runs
        subprocess.run(["docker", "exec", name, "true"], check=True)
        berth_ms, docker_ms = [], []
        for _ in range(a.rounds):
            time.sleep(a.settle)
            t = time.perf_counter()
            r = env.execute("true")
            berth_ms.append((time.perf_counter() - t) * 1000)
            assert r["returncode"] == 0, r
            time.sleep(a.settle)
            t = time.perf_counter()
            subprocess.run(["docker", "exec", name, "true"], check=True)
            docker_ms.append((time.perf_counter() - t) * 1000)
        one_ms, many_ms = [], []
        for _ in range(a.rounds if a.parallel > 0 else 0):
            t = time.perf_counter()
            r = env.execute(a.parallel_command)
            one_ms.append((time.perf_counter() - t) * 1000)
            assert r["returncode"] == 0, r
            results = []
            threads = [threading.Thread(target=lambda: results.append(env.execute(a.parallel_command))) for _ in range(a.parallel)]
            t = time.perf_counter()
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            many_ms.append((time.perf_counter() - t) * 1000)
            assert len(results) == a.parallel and all(x["returncode"] == 0 for x in results), results
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)
    load = os.getloadavg()
    print("rounds %d, settle %.0f ms, load average %.2f %.2f %.2f" % (a.rounds, a.settle * 1000, *load))
    for label, xs in (("berth hermes execute(\"true\")", berth_ms), ("docker exec C true", docker_ms)):
        print("%-30s p50 %7.2f ms  p95 %7.2f ms  mean %7.2f ms" % (label, pct(xs, 50), pct(xs, 95), statistics.mean(xs)))
    print("ratio berth/docker: p50 %.3f  p95 %.3f" % (pct(berth_ms, 50) / pct(docker_ms, 50), pct(berth_ms, 95) / pct(docker_ms, 95)))
    if one_ms:
        label = "%r" % a.parallel_command
        print("%-30s p50 %7.2f ms  p95 %7.2f ms  (one call)" % (label, pct(one_ms, 50), pct(one_ms, 95)))
        print("%-30s p50 %7.2f ms  p95 %7.2f ms  (%d at once, wall)" % (label, pct(many_ms, 50), pct(many_ms, 95), a.parallel))
        print("ratio %d at once / one: p50 %.3f  p95 %.3f" % (a.parallel, pct(many_ms, 50) / pct(one_ms, 50), pct(many_ms, 95) / pct(one_ms, 95)))


if __name__ == "__main__":
    main()
