#!/usr/bin/env python3
"""Kernel durations of one model step, from an Nsight Compute CSV.

Run a program under `ncu --csv --metrics gpu__time_duration.sum --print-units base
--log-file FILE` (every kernel, graph nodes one by one, serialized: no launch gaps,
no PDL overlap), then: tools/ncu_step_profile.py FILE [--step-kernel embed_kernel]
It splits the kernels into steps at each launch of the step's first kernel, prints
every step's kernel count and summed duration, and for the step chosen (default:
the last step with the fewest kernels, i.e. a decode step) the kernels by family
(name without template arguments) with calls, µs and share, and the count of
kernels under 5 µs — the part of the step that launch latency, not bandwidth,
bounds. The sum is what the step would take with no gap between kernels.
"""
import argparse
import collections
import csv
import re
import sys


def rows(path):
    with open(path, newline="") as f:
        lines = f.readlines()
    start = next(i for i, l in enumerate(lines) if l.startswith('"ID"'))
    for r in csv.DictReader(lines[start:]):
        if r.get("Metric Name") == "gpu__time_duration.sum":
            yield r["Kernel Name"], float(r["Metric Value"].replace(",", "")) / 1000.0  # ns -> us


def family(name):
    """The kernel's name with its template arguments, without namespaces, `void` and parameters."""
    for junk in ("(anonymous namespace)::", "<unnamed>::", "unnamed>::", "cuda::", "cm::", "void "):
        name = name.replace(junk, "")
    return name.split("(")[0].strip()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--step-kernel", default="embed_kernel", help="the first kernel of a step (substring)")
    ap.add_argument("--step", type=int, default=None, help="which step to list (index; default: a decode step)")
    ap.add_argument("--order", action="store_true", help="also list the step's kernels in launch order")
    a = ap.parse_args()
    steps = []
    for name, us in rows(a.csv):
        if a.step_kernel in name or not steps:
            steps.append([])
        steps[-1].append((name, us))
    if not steps:
        sys.exit("no kernels in " + a.csv)
    for i, s in enumerate(steps):
        print(f"step {i:3d}: {len(s):5d} kernels  {sum(u for _, u in s):10.1f} us")
    if a.step is None:
        real = [i for i in range(len(steps)) if any(a.step_kernel in n for n, _ in steps[i])]
        fewest = min(len(steps[i]) for i in real)
        a.step = max(i for i in real if len(steps[i]) == fewest)
    s = steps[a.step]
    total = sum(u for _, u in s)
    fam = collections.OrderedDict()
    for name, us in s:
        f = fam.setdefault(family(name), [0, 0.0])
        f[0] += 1
        f[1] += us
    if a.order:
        print(f"\nstep {a.step} in launch order:")
        for name, us in s:
            print(f"  {family(name)[:60]:60s} {us:9.2f} us")
    print(f"\nstep {a.step}: {len(s)} kernels, {total:.1f} us of kernel time "
          f"(kernels under 5 us: {sum(1 for _, u in s if u < 5)}, their time {sum(u for _, u in s if u < 5):.1f} us)")
    for f, (n, us) in sorted(fam.items(), key=lambda kv: -kv[1][1]):
        print(f"  {f[:60]:60s} {n:5d} calls {us:9.1f} us {100 * us / total:5.1f}%  {us / n:7.2f} us/call")


if __name__ == "__main__":
    main()
