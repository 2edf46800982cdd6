#!/usr/bin/env bash
set -u
ARGS=(--no-peer --no-candle-layer --impls simd_1t --kernels gather --layer-ops bag_sum,bag_sum_warm,bag_mean,bag_max,forward --format-ops bag_sum,bag_sum_warm,lookup --formats f32,f16,int8,int4 --budget-ms 200 --json)
for round in 1 2 3; do
  for side in head new; do
    start=$(date +%s)
    /tmp/report-$side "${ARGS[@]}" > ./$side-$round.json 2>./$side-$round.err
    echo "round $round $side rc=$? $(( $(date +%s) - start )) s"
  done
done
