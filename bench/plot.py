#!/usr/bin/env python3
"""Draws bench/results/ratios.json as bench/ratios.png: each comparison's ratio idem/baseline
(measured in the same run) next to its target. Needs python3-matplotlib
(scripts/install-deps.sh tools).

Usage: bench/plot.py [output.png]
"""
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import ratios  # noqa: E402


def main(argv):
    out = argv[1] if len(argv) > 1 else "bench/ratios.png"
    entries = ratios.load()
    if not entries:
        print("no ratios recorded yet: run the bench/ scripts first", file=sys.stderr)
        return 1
    labels = sorted(entries)
    values = [entries[label]["ratio"] for label in labels]
    targets = [entries[label]["target"] for label in labels]
    colors = ["tab:green" if v >= t else "tab:red" for v, t in zip(values, targets)]

    fig, ax = plt.subplots(figsize=(10, 0.45 * len(labels) + 1.5))
    y = range(len(labels))
    ax.barh(y, values, color=colors)
    ax.scatter(targets, y, marker="|", s=400, color="black", label="target", zorder=3)
    for i, v in enumerate(values):
        ax.text(v, i, f" {v:.0%}", va="center", fontsize=8)
    ax.set_yticks(list(y))
    ax.set_yticklabels(labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("idem / baseline in the same run (median of runs; higher is better)")
    ax.set_title("idem next to the raw clients")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
