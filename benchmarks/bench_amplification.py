#!/usr/bin/env python3
"""Shuffle-amplification accountant: time per call and the bound of each method.

For each (eps0, n) at the given delta: the stronger-clone bound (the default, "numerical"),
FMT'21 Theorem 3.2 with and without the mixing step, the closed form, and the wall time of the
default per call (best of --repeat; a fresh computation each time, nothing is cached).

    python benchmarks/bench_amplification.py [--delta 1e-6] [--repeat 3]
"""

from __future__ import annotations

import argparse
import time

from lac.shuffler.amplification import shuffle_epsilon


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--delta", type=float, default=1e-6)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    shuffle_epsilon(1.0, 1000, args.delta)  # imports, first-call overheads
    print(f"delta = {args.delta:g}")
    print(
        f"{'eps0':>5} {'n':>9} {'numerical':>10} {'fmt21':>10} {'fmt21_nomix':>11} {'closed_form':>11} {'ms/call':>8}"
    )
    for eps0 in (0.5, 1.0, 2.0, 4.0, 6.0):
        for n in (10**3, 10**4, 10**5, 10**6):
            best = float("inf")
            for _ in range(args.repeat):
                t = time.perf_counter()
                r = shuffle_epsilon(eps0, n, args.delta)
                best = min(best, time.perf_counter() - t)
            others = [
                shuffle_epsilon(eps0, n, args.delta, method=m).epsilon for m in ("fmt21", "fmt21_nomix", "closed_form")
            ]
            print(
                f"{eps0:>5g} {n:>9d} {r.epsilon:>10.6f} {others[0]:>10.6f} {others[1]:>11.6f} "
                f"{others[2]:>11.6f} {best * 1e3:>8.1f}"
            )


if __name__ == "__main__":
    main()
