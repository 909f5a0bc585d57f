"""CPU charged to this thread (its schedstat run time) for one time.sleep(g)."""

import os
import time


def run_ns():
    return int(open(f"/proc/self/task/{os.getpid()}/schedstat").read().split()[0])


for g in (0.001, 0.01, 0.1, 0.3, 1.0):
    total = 0
    for _ in range(10):
        before = run_ns()
        time.sleep(g)
        total += run_ns() - before
    print("sleep", g, "charged us", total / 10 / 1000)
