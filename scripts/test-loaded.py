#!/usr/bin/env python3
"""Run the test suite (or any command) while busy-loop processes keep every core busy.

    scripts/test-loaded.py                  # make test, with one burner per core (make test-loaded)
    scripts/test-loaded.py bash .ci/run     # the whole CI run, loaded
    BURNERS=4 scripts/test-loaded.py make test-fast

CI runs on a loaded 2-core machine: a test that passes only on a quiet one fails there by chance. This starts
``BURNERS`` processes (default: one per core) that spin on the CPU at normal priority, runs the command, stops
the burners by PID whatever happens, and prints the load average it saw (sampled every 5 s from
/proc/loadavg) and the command's wall time. It exits with the command's status.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time


def burn() -> None:
    """Spin until killed."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the command; the parent stops us
    while True:
        pass


def load_average() -> float:
    with open("/proc/loadavg") as loadavg:
        return float(loadavg.read().split()[0])


def main(argv: list[str]) -> int:
    command = argv or ["make", "test"]
    count = int(os.environ.get("BURNERS", os.cpu_count() or 2))
    burners = [multiprocessing.Process(target=burn, daemon=True) for _ in range(count)]
    for burner in burners:
        burner.start()
    pids = " ".join(str(burner.pid) for burner in burners)
    print(f"test-loaded: {count} busy-loop burners (PIDs {pids}), running: {' '.join(command)}", flush=True)

    samples: list[float] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(5.0):
            samples.append(load_average())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.monotonic()
    try:
        status = subprocess.call(command)
    except KeyboardInterrupt:
        status = 130
    finally:
        done.set()
        for burner in burners:
            burner.kill()
        for burner in burners:
            burner.join()
    wall = time.monotonic() - started
    if samples:
        seen = (
            f"load average (1 min) min {min(samples):.1f}, mean {sum(samples) / len(samples):.1f}, "
            f"max {max(samples):.1f} over {len(samples)} samples"
        )
    else:
        seen = f"load average (1 min) {load_average():.1f} at the end"
    print(f"test-loaded: {' '.join(command)} exited {status} after {wall:.0f} s; {seen}", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
