#!/usr/bin/env python3
"""Keeps bench/results/ratios.json: the latest ratio of each comparison idem states a target for.

Every benchmark script that measures idem next to a baseline in the same run records its ratio
here (`record(...)`), with what bench/plot.py needs to draw it honestly: the face and panel it
belongs to, a short bar label, the command that reproduces it, and when, at which commit and on
which machine it was measured.
"""
import json
import os
import platform
import subprocess
import time

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "ratios.json")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load():
    try:
        with open(PATH) as f:
            return json.load(f)
    except FileNotFoundError:
        return {}


def commit():
    """The checked-out commit, "+changes" when tracked files differ from it; "?" outside git.

    bench/results is left out: a run that records several ratios writes it between them."""
    try:
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short=7", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "diff", "--quiet", "HEAD", "--", ".",
                                ":(exclude)bench/results"],
                               capture_output=True).returncode != 0
        return head + ("+changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "?"


def machine():
    """CPUs, CPU model and OS, e.g. "2 CPUs, AMD EPYC, Debian GNU/Linux 12 (bookworm)"."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    system = platform.system()
    try:
        with open("/etc/os-release") as f:
            for line in f:
                if line.startswith("PRETTY_NAME="):
                    system = line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return f"{os.cpu_count()} CPUs, {model}, {system}"


def record(label, ratio, target, detail="", *, face, group, bar, command):
    """ratio = idem / baseline (higher is better); target = the lowest acceptable ratio.

    face: "consumer" or "operation"; group: the panel (what is compared with what); bar: the
    bar's label within it; command: the shell command that measures it again.
    """
    entries = load()
    entries[label] = {
        "ratio": ratio,
        "target": target,
        "detail": detail,
        "face": face,
        "group": group,
        "bar": bar,
        "command": command,
        "commit": commit(),
        "machine": machine(),
        "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    os.makedirs(os.path.dirname(PATH), exist_ok=True)
    with open(PATH, "w") as f:
        json.dump(entries, f, indent=2, sort_keys=True)
        f.write("\n")
