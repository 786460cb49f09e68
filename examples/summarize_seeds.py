#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Summarizes train_fashion_mnist CSVs of several seeds (one file per seed) as the markdown
table of docs/performance.md: per compressor, the final test accuracy's mean and spread
(min to max) over the seeds, the mean of its difference to dense ("none") seed by seed, the
bytes a rank sent (the most of any rank, the last epoch's total) and how many times fewer than
dense.

    examples/summarize_seeds.py [--after EPOCH] build/fm_seed1/results.csv ...

With --after EPOCH the bytes are those sent after that epoch (a warm-up's epochs left out),
against dense's over the same epochs.
"""
import csv
import sys


def final_rows(path, after):
    """{compressor: (accuracy, bytes)} at each run's last epoch; bytes since epoch `after`."""
    last = {}
    before = {}
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if not row or row[3] == "epoch":
                continue
            name, epoch, accuracy, sent = row[0], int(row[3]), float(row[5]), float(row[8])
            if name not in last or epoch >= last[name][0]:
                last[name] = (epoch, accuracy, sent)
            if epoch == after:
                before[name] = sent
    return {name: (acc, sent - before.get(name, 0)) for name, (_, acc, sent) in last.items()}


def main(args):
    after = 0
    if args[:1] == ["--after"]:
        after, args = int(args[1]), args[2:]
    seeds = [final_rows(p, after) for p in args]
    names = []
    for s in seeds:
        names += [n for n in s if n not in names]
    print(f"| compressor | final test accuracy, mean (min - max) over {len(seeds)} seeds "
          "| vs dense, mean of the per-seed differences "
          f"| bytes sent per rank{f' after epoch {after}' if after else ', 10 epochs'} "
          "| fewer bytes than dense |")
    print("|---|---|---|---|---|")
    for name in names:
        runs = [s[name] for s in seeds if name in s]
        accs = [100 * a for a, _ in runs]
        diffs = [100 * (s[name][0] - s["none"][0]) for s in seeds if name in s and "none" in s]
        sent = max(b for _, b in runs)
        dense = max((s["none"][1] for s in seeds if "none" in s), default=None)
        mean = sum(accs) / len(accs)
        spread = f"{min(accs):.2f} - {max(accs):.2f}" if len(accs) > 1 else "one seed"
        diff = f"{sum(diffs) / len(diffs):+.2f}" if diffs else "-"
        ratio = f"{dense / sent:.1f}x" if dense else "-"
        print(f"| {name} | {mean:.2f}% ({spread}) | {diff} | {sent / 1e6:,.1f} MB | {ratio} |")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
