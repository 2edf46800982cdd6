#!/usr/bin/env bash
# Alternating A/B of the report: old and new binaries, three rounds.
set -u
ARGS=(--no-peer --no-candle-layer --impls simd_1t,simd_rayon --budget-ms 250 --json)
for round in 1 2 3; do
  for side in old new; do
    start=$(date +%s)
    /tmp/report-$side "${ARGS[@]}" > /tmp/ab/$side-$round.json 2>/tmp/ab/$side-$round.err
    echo "round $round $side rc=$? $(( $(date +%s) - start )) s"
  done
done
