#!/usr/bin/env python3
"""Where a replayed decode step's time goes, from a step trace (src/backends/cuda/step_trace.h).

Build with -DSPARK_STEP_TRACE=ON, run any program with SPARK_STEP_TRACE_OUT=trace.csv (spark-bench
-n 32 is enough), then:

    tools/bench/step_trace.py trace.csv [--layer N] [--skip S]

Each kernel's share of the step is the time from its first block's release (its pdl::wait
returned: every earlier kernel complete) to the next kernel's. Per op key (the op, its shape and
weight, as SPARK_PROFILE_OPS names them) it prints calls per step, microseconds per call and per
step (median over the traced steps), the share of the step, the lead (how long before its release
the first block had arrived at its wait: the prologue that overlapped the kernel before) and the
spread (first to last block released: blocks that became resident late). --layer N also lists the
kernels of the N-th repetition of the step's repeating pattern in order (a decoder layer), with, for
kernels that mark the phases of their work (step_trace.cuh: the tensor-core decode GEMV; the
attention decode, whose three phases are its prologue up to the first tiles requested, its tile
loop and its results or merge), the blocks' median times after the release at which the activation
split, the main loop and the last store were done, and the hop: from the kernel's last block done to the next kernel's release (its
completion, the memory flush and the next wait).
"""
import argparse
import csv
import statistics
import sys
from collections import defaultdict


def load(path, skip):
    steps = defaultdict(list)
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            steps[int(row["step"])].append(row)
    out = []
    for s in sorted(steps):
        if s < skip:
            continue
        rows = sorted(steps[s], key=lambda r: int(r["index"]))
        out.append(rows)
    return out


def short(kernel):
    k = kernel.split("(")[0]
    return k.split("<")[0].split("::")[-1] if k else "?"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("--skip", type=int, default=2, help="traced steps to skip (default 2)")
    ap.add_argument("--layer", type=int, default=-1, help="list the kernels of this repetition of the layer pattern")
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    steps = load(a.trace, a.skip)
    if not steps:
        sys.exit("no traced steps (after --skip)")
    n = min(len(s) for s in steps)
    if any(len(s) != n for s in steps):
        print(f"warning: steps have {sorted(set(len(s) for s in steps))} kernels; using the first {n}")
    # Per kernel index: median over steps of its share (release to next release).
    share, lead, spread, phases, hop = [], [], [], [], []
    marks = ("split_med_ns", "loop_med_ns", "end_med_ns")
    for i in range(n):
        sh, ld, sp, ph, hp = [], [], [], [[] for _ in marks], []
        for s in steps:
            r = s[i]
            rel = int(r["first_release_ns"])
            nxt = int(s[i + 1]["first_release_ns"]) if i + 1 < n else int(r["last_release_ns"])
            sh.append(nxt - rel)
            ld.append(rel - int(r["first_arrive_ns"]))
            sp.append(int(r["last_release_ns"]) - rel)
            for m, v in zip(marks, ph):
                if int(r.get(m) or -1) >= 0:
                    v.append(int(r[m]))
            if int(r.get("last_end_ns") or -1) >= 0 and i + 1 < n:
                hp.append(nxt - int(r["last_end_ns"]))
        share.append(statistics.median(sh))
        lead.append(statistics.median(ld))
        spread.append(statistics.median(sp))
        phases.append([statistics.median(v) if v else None for v in ph])
        hop.append(statistics.median(hp) if hp else None)
    rows0 = steps[0]
    step_ns = sum(share)
    print(f"{len(steps)} steps, {n} kernels per step, step {step_ns / 1000:.1f} us "
          f"(first release to the last kernel's last release, median per kernel)")
    agg = defaultdict(lambda: [0, 0.0, 0.0, 0.0, set(), 0])
    for i in range(n):
        r = rows0[i]
        e = agg[r["label"]]
        e[0] += 1
        e[1] += share[i]
        e[2] += lead[i]
        e[3] += spread[i]
        e[4].add(short(r["kernel"]))
        e[5] += int(r["blocks_seen"])
    print(f"\n| op (key) | kernel | calls | us / call | us / step | share | lead us | spread us | blocks |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for key, e in sorted(agg.items(), key=lambda kv: -kv[1][1])[: a.top]:
        c = e[0]
        print(f"| {key} | {'/'.join(sorted(e[4]))} | {c} | {e[1] / c / 1000:.2f} | {e[1] / 1000:.1f} | "
              f"{100 * e[1] / step_ns:.1f}% | {e[2] / c / 1000:.2f} | {e[3] / c / 1000:.2f} | {e[5] // c} |")
    if a.layer >= 0:
        # The step's repeating pattern (a decoder layer): the smallest period P with which the kernel
        # keys repeat over most of the step, starting at the first kernel from which they do.
        labels = [rows0[i]["label"] for i in range(n)]
        period, start = 0, 0
        for p in range(2, max(3, n // 3)):
            hits = [labels[i] == labels[i + p] for i in range(n - p)]
            if sum(hits) >= 0.9 * len(hits):
                period = p
                start = next(i for i in range(n - 2 * p) if all(hits[i:i + 2 * p]))
                break
        if not period:
            sys.exit("no repeating layer pattern found")
        b = start + a.layer * period
        if b + period > n:
            sys.exit(f"only {(n - start) // period} repetitions of {period} kernels")
        e = b + period
        print(f"\nrepetition {a.layer} of the {period}-kernel pattern from kernel {start} ({sum(share[b:e]) / 1000:.2f} us):")
        print("| # | op (key) | kernel | blocks | us | lead us | spread us | split / loop / end us | hop us |")
        print("|---:|---|---|---:|---:|---:|---:|---:|---:|")

        def us(v):
            return "-" if v is None else f"{v / 1000:.2f}"

        for i in range(b, e):
            r = rows0[i]
            print(f"| {i} | {r['label']} | {short(r['kernel'])} | {r['blocks_seen']} | {share[i] / 1000:.2f} | "
                  f"{lead[i] / 1000:.2f} | {spread[i] / 1000:.2f} | {' / '.join(us(v) for v in phases[i])} | {us(hop[i])} |")


if __name__ == "__main__":
    main()
