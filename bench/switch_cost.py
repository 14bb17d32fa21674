"""Switch cost behind dy.autobatch_map's choice of greenlets over threads.

    python bench/switch_cost.py

A sample parks and resumes once per value it reads; this times a round trip (park + resume)
between a driver and a sample: greenlet.switch against a two-thread handoff through Conditions.
"""
from __future__ import annotations

import threading
import time

N = 20000


def greenlet_round_trip() -> float:
    from greenlet import getcurrent, greenlet
    driver = getcurrent()

    def sample():
        while True:
            driver.switch()

    let = greenlet(sample)
    let.switch()
    t = time.perf_counter()
    for _ in range(N):
        let.switch()
    return (time.perf_counter() - t) / N


def thread_round_trip() -> float:
    cond = threading.Condition()
    turn = ["driver"]

    def sample():
        for _ in range(N):
            with cond:
                while turn[0] != "sample":
                    cond.wait()
                turn[0] = "driver"
                cond.notify()

    th = threading.Thread(target=sample)
    th.start()
    t = time.perf_counter()
    for _ in range(N):
        with cond:
            turn[0] = "sample"
            cond.notify()
            while turn[0] != "driver":
                cond.wait()
    elapsed = time.perf_counter() - t
    th.join()
    return elapsed / N


if __name__ == "__main__":
    g, th = greenlet_round_trip(), thread_round_trip()
    print(f"park + resume round trip: greenlet {g * 1e6:.2f} us, threads (Condition) {th * 1e6:.2f} us, "
          f"ratio {th / g:.0f}x")
