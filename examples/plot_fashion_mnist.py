#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Plots train_fashion_mnist's CSV: test accuracy against epoch, against the bytes each rank
sent (log scale) and against wall time (the epochs' wall times added up), one line per
compressor. Needs Debian's python3-matplotlib.

    examples/plot_fashion_mnist.py results.csv out.png
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: plot_fashion_mnist.py RESULTS.csv OUT.png")
    runs = {}
    with open(sys.argv[1], newline="") as f:
        for row in csv.DictReader(f):
            runs.setdefault(row["compressor"], []).append(row)
    if not runs:
        sys.exit(f"{sys.argv[1]}: no rows")
    fig, (by_epoch, by_bytes, by_time) = plt.subplots(1, 3, figsize=(20, 6))
    colors = plt.get_cmap("tab20").colors
    for n, (name, rows) in enumerate(runs.items()):
        rows.sort(key=lambda r: int(r["epoch"]))
        epochs = [int(r["epoch"]) for r in rows]
        accuracy = [100 * float(r["test_accuracy"]) for r in rows]
        wire = [float(r["wire_bytes_per_rank"]) for r in rows]
        wall = []
        for r in rows:
            wall.append((wall[-1] if wall else 0.0) + float(r["wall_s"]))
        style = "-" if name.endswith("+ef") or "+ef@" in name or name == "none" else "--"
        color = colors[n % len(colors)]
        by_epoch.plot(epochs, accuracy, style, color=color, marker="o", markersize=3, label=name)
        by_bytes.plot(wire, accuracy, style, color=color, marker="o", markersize=3, label=name)
        by_time.plot(wall, accuracy, style, color=color, marker="o", markersize=3, label=name)
    ranks = next(iter(runs.values()))[0]["ranks"]
    by_epoch.set(xlabel="epoch", ylabel="test accuracy (%)", title=f"Fashion-MNIST, {ranks} ranks")
    by_bytes.set(xlabel="bytes sent per rank (cumulative)", ylabel="test accuracy (%)", xscale="log",
                 title="accuracy against bytes on the wire")
    by_time.set(xlabel="wall time (s, cumulative)", ylabel="test accuracy (%)",
                title="accuracy against wall time")
    for ax in (by_epoch, by_bytes, by_time):
        ax.grid(True, alpha=0.3)
    by_epoch.text(0.01, 0.01, "solid: dense or with error feedback; dashed: without",
                  transform=by_epoch.transAxes, fontsize=8)
    by_bytes.legend(fontsize=7, loc="lower right", ncol=2)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=110)


if __name__ == "__main__":
    main()
