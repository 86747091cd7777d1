#!/usr/bin/env python3
"""Draws bench/results/ratios.json as bench/ratios.png: each comparison's ratio idem / baseline
(both measured in the same run on the same machine) next to idem's target for it.

One panel per comparison, grouped by face (consumer, then operation), each with its own ratio
axis so that no panel's scale squashes another's. Every panel says when, at which commit and with
which command its bars were measured; the figure names the machine. A bar below its target is
red and says why, in BENCHMARKS.md's words (BELOW_TARGET below). Needs matplotlib
(python3-matplotlib: scripts/install-deps.sh tools).

Usage: python3 bench/plot.py [output.png]
"""
import re
import sys
import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import ratios  # noqa: E402

# Why a bar is below its target, as BENCHMARKS.md explains it (label pattern, reason). A red bar
# with no entry here is drawn with "no reason recorded" and named on stderr: explain it in
# BENCHMARKS.md and here, or revise the target there.
BELOW_TARGET = [
    (r"^rabbitmq dedup ",
     "the broker takes ~1.3 of the 2 cores; the store's work shares the rest "
     "(BENCHMARKS.md, consumer rows 12-15)"),
    (r"^Redis recorder SET NX / redis-benchmark \(c=1, P=16\)",
     "at raw hiredis's rate (1.05\u00d7); redis-benchmark's own client loop is faster "
     "(BENCHMARKS.md, consumer row 7)"),
    (r"^idem proxy .*static upstream",
     "an upstream that costs nothing leaves the proxy's own per-request cost: two store writes "
     "per new key, a store read per replay, one thread (BENCHMARKS.md, HTTP face rows 3-4; "
     "DESIGN-NOTES \u00a787)"),
    (r"^Redis store new keys / ",
     "a new key is two round trips and the fenced completion script; raw hiredis sending idem's "
     "very commands is the floor (BENCHMARKS.md, async face P1, P3)"),
    (r"^Redis store .*async / blocking, 1 call in flight",
     "4 system calls per round trip against 3: Asio 1.22's reactor re-registers a waited-on "
     "socket with epoll_ctl (BENCHMARKS.md, async face P4)"),
    (r"\(text255 ids\)",
     "first-touch memory of 255 bytes per id bounds idem and the set alike "
     "(BENCHMARKS.md, consumer rows 1-2)"),
]

# Panels in this order; a group not named here comes after them, in its face.
GROUP_ORDER = ["memory recorder", "SQLite recorder", "Redis recorder", "PostgreSQL recorder",
               "RabbitMQ consumer", "SQLite store"]
FACE_ORDER = ["consumer", "operation"]


def reason_for(label):
    for pattern, reason in BELOW_TARGET:
        if re.search(pattern, label):
            return reason
    return None


def group_rank(group):
    for i, prefix in enumerate(GROUP_ORDER):
        if group.startswith(prefix):
            return i
    return len(GROUP_ORDER)


def when(entries):
    """"2026-12-01 16:01-16:04 UTC" for entries measured on one day; else each day's span."""
    days = {}
    for e in entries:
        day, clock = e["measured"].split(" ")[:2]
        days.setdefault(day, []).append(clock)
    parts = []
    for day, clocks in sorted(days.items()):
        first, last = min(clocks), max(clocks)
        parts.append(f"{day} {first}" + (f"-{last}" if last != first else ""))
    return ", ".join(parts) + " UTC"


def main(argv):
    out = argv[1] if len(argv) > 1 else "bench/ratios.png"
    entries = ratios.load()
    if not entries:
        print("no ratios recorded yet: run the bench/ scripts first", file=sys.stderr)
        return 1
    missing = [label for label, e in entries.items() if "group" not in e]
    if missing:
        print("entries recorded without face/group/command (run their benchmark again): "
              + "; ".join(missing), file=sys.stderr)
        return 1

    panels = {}
    for label, e in entries.items():
        panels.setdefault((e["face"], e["group"]), []).append((label, e))
    order = sorted(panels, key=lambda k: (FACE_ORDER.index(k[0]) if k[0] in FACE_ORDER
                                          else len(FACE_ORDER), group_rank(k[1]), k[1]))
    for key in order:
        panels[key].sort(key=lambda item: item[1]["bar"])

    heights = [len(panels[key]) + 2.2 for key in order]
    fig, axes = plt.subplots(len(order), 1, figsize=(15, 0.3 * sum(heights) + 1.6),
                             gridspec_kw={"height_ratios": heights})
    if len(order) == 1:
        axes = [axes]
    unexplained = []
    for ax, key in zip(axes, order):
        face, group = key
        rows = panels[key]
        values = [e["ratio"] for _, e in rows]
        targets = [e["target"] for _, e in rows]
        below = [v < t for v, t in zip(values, targets)]
        y = list(range(len(rows)))
        ax.barh(y, values, height=0.6,
                color=["#c0392b" if b else "#27ae60" for b in below])
        ax.scatter(targets, y, marker="|", s=260, linewidths=2.2, color="black", zorder=3)
        top = max(values + targets) * 1.08
        ax.set_xlim(0, top)
        if top > 1:
            ax.axvline(1.0, color="0.6", linestyle=":", linewidth=1, zorder=0)
        ax.set_yticks(y)
        ax.set_yticklabels([e["bar"] for _, e in rows], fontsize=8.5)
        ax.invert_yaxis()
        ax.tick_params(axis="x", labelsize=8)
        ax.grid(axis="x", color="0.9", zorder=0)
        ax.set_axisbelow(True)
        # The figures in a column right of the axes, where no bar or tick can cover them; a red
        # bar's reason as a lettered note under the column (one note per distinct reason).
        notes = []
        for i, ((label, e), b) in enumerate(zip(rows, below)):
            text = f"{e['ratio']:.2f}\u00d7   target \u2265 {e['target']:.2f}\u00d7"
            if b:
                reason = reason_for(label)
                if reason is None:
                    unexplained.append(label)
                    reason = "no reason recorded (bench/plot.py BELOW_TARGET)"
                if reason not in notes:
                    notes.append(reason)
                text += f"   below target ({'abcdefghij'[notes.index(reason)]})"
            ax.text(1.01, i, text, transform=ax.get_yaxis_transform(), va="center",
                    fontsize=8.5, color="#c0392b" if b else "black")
        if notes:
            block = "\n".join(line for n, reason in enumerate(notes)
                              for line in textwrap.wrap(f"({'abcdefghij'[n]}) {reason}", 80))
            ax.text(1.01, -0.1, block, transform=ax.transAxes, va="top", fontsize=8,
                    color="#c0392b")
        commits = ", ".join(sorted({e["commit"] for _, e in rows}))
        commands = "; ".join(sorted({e["command"] for _, e in rows}))
        ax.set_title(f"{face} face: {group}", loc="left", fontsize=10, fontweight="bold",
                     pad=22)
        subtitle = f"measured {when([e for _, e in rows])} at {commits}: {commands}"
        ax.text(0, 1.02, "\n".join(textwrap.wrap(subtitle, 170)), transform=ax.transAxes,
                fontsize=7.5, color="0.25", va="bottom")

    machines = "; ".join(sorted({e["machine"] for e in entries.values()}))
    fig.suptitle("idem / baseline, both measured in the same run on the same machine (medians; "
                 "higher is better; black tick = idem's target, red bar = below it)",
                 fontsize=11.5, x=0.01, y=1 - 0.15 / fig.get_figheight(), ha="left", va="top")
    fig.text(0.01, 0.004, f"Machine: {machines}; builds, servers and what each row measures: "
             "BENCHMARKS.md. Figure: python3 bench/plot.py", fontsize=8, color="0.25")
    fig.subplots_adjust(left=0.19, right=0.6, top=1 - 1.0 / fig.get_figheight(),
                        bottom=0.55 / fig.get_figheight(), hspace=1.1)
    fig.savefig(out, dpi=100)
    print(f"wrote {out}")
    if unexplained:
        print("below target without a reason: " + "; ".join(unexplained), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
