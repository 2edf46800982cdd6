"""What a pause between calls costs a split call, with and without the pool's spin.

The NumPy bag sum on minilm's table (30 522 x 384, 8 192 ids in bags of 16, into a
held ``out``), timed alone while the script busy-waits a given number of µs between
calls, as Python code around a call does. Each spin setting runs in a process of its
own (``EMBEDDING_KERNELS_SPIN_US`` is read at import), the settings alternating per
round; the table holds the median call of each, in µs.

    python python/bench/spin.py [--rounds 3] [--spins 0,100] [--gaps 0,5,10,20,50,100,200]
"""

import argparse
import os
import statistics
import subprocess
import sys
import time


def measure(gaps, seconds):
    """In the child: the median call time for each gap, in µs."""
    import numpy as np

    import embedding_kernels as ek

    rows, dim, n = 30_522, 384, 8_192
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((rows, dim), dtype=np.float32)
    ids = rng.integers(0, rows, n)
    offsets = np.arange(0, n, 16)
    out = np.empty((n // 16, dim), np.float32)
    clock = time.perf_counter

    def median_call(gap_us, budget):
        times = []
        gap = gap_us * 1e-6
        end = clock() + budget
        while clock() < end:
            start = clock()
            ek.embedding_bag(weight, ids, offsets, mode="sum", out=out)
            done = clock()
            times.append(done - start)
            while clock() - done < gap:
                pass
        return statistics.median(times) * 1e6

    median_call(0, 0.2)
    return [median_call(g, seconds) for g in gaps]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--spins", default="0,100", help="EMBEDDING_KERNELS_SPIN_US values")
    parser.add_argument("--gaps", default="0,5,10,20,50,100,200", help="µs between calls")
    parser.add_argument("--seconds", type=float, default=0.4, help="timed seconds per gap")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    gaps = [int(g) for g in args.gaps.split(",")]
    if args.child:
        print(",".join(f"{t:.1f}" for t in measure(gaps, args.seconds)))
        return
    spins = args.spins.split(",")
    env = dict(os.environ)
    env.setdefault("RAYON_NUM_THREADS", "2")
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC; RAYON_NUM_THREADS="
          f"{env['RAYON_NUM_THREADS']}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print("minilm bag sum into a held out, median µs per call, by µs of busy wait between calls")
    print("| spin µs | round | " + " | ".join(str(g) for g in gaps) + " |")
    print("| --- | ---: |" + " ---: |" * len(gaps))
    for r in range(args.rounds):
        order = spins if r % 2 == 0 else spins[::-1]
        for spin in order:
            child = subprocess.run(
                [sys.executable, __file__, "--child", "--gaps", args.gaps,
                 "--seconds", str(args.seconds)],
                env=dict(env, EMBEDDING_KERNELS_SPIN_US=spin),
                capture_output=True, text=True, check=True,
            )
            cells = child.stdout.strip().split(",")
            print(f"| {spin} | {r + 1} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
