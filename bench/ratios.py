#!/usr/bin/env python3
"""Keeps bench/results/ratios.json: the latest ratio of each comparison idem states a target for.

Every benchmark script that measures idem next to a baseline in the same run records its ratio
here (`record(...)`); bench/plot.py draws them all against their targets.
"""
import json
import os
import time

PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "ratios.json")


def load():
    try:
        with open(PATH) as f:
            return json.load(f)
    except FileNotFoundError:
        return {}


def record(label, ratio, target, detail=""):
    """ratio = idem / baseline (higher is better); target = the lowest acceptable ratio."""
    entries = load()
    entries[label] = {
        "ratio": ratio,
        "target": target,
        "detail": detail,
        "measured": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    os.makedirs(os.path.dirname(PATH), exist_ok=True)
    with open(PATH, "w") as f:
        json.dump(entries, f, indent=2, sort_keys=True)
        f.write("\n")
