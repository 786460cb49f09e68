#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The training figures (issue 7, docs/performance.md): builds examples/train_fashion_mnist
# (release preset), trains a 784-256-10 network on Fashion-MNIST on 4 ranks for 10 epochs with
# each compressor below, writes $OUT/results.csv (default build/fashion_mnist) and plots it to
# $OUT/accuracy.png. Extra arguments go to train_fashion_mnist and override the defaults
# (e.g. --epochs 2, -c none,topk:0.01+ef, -n 2).
set -euo pipefail
cd "$(dirname "$0")/.."
SQUALL_SETUP_PLOT=1 ./scripts/setup.sh
./scripts/build-release.sh train_fashion_mnist
out="${OUT:-build/fashion_mnist}"
mkdir -p "$out"
rm -f "$out/results.csv"
compressors=none,cast:fp16,int8,qsgd:4,terngrad,sign+ef,sign,topk:0.01+ef,topk:0.01+ef@gtopk
compressors+=,topk:0.001+ef,topk:0.001+ef@gtopk,topk:0.01,randomk:0.01+ef,randomk:0.01
compressors+=,count_sketch:4096+ef,count_sketch:4096,powersgd:4+ef,powersgd:4
build/release/examples/train_fashion_mnist -n 4 --epochs 10 -c "$compressors" --csv "$out/results.csv" "$@"
# Debian's python3 (where apt put matplotlib), not one a version manager put first on PATH
python=/usr/bin/python3
[[ -x "$python" ]] || python=python3
"$python" examples/plot_fashion_mnist.py "$out/results.csv" "$out/accuracy.png"
echo "train.sh: $out/results.csv, $out/accuracy.png"
