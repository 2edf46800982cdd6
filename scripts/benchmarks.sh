#!/usr/bin/env bash
# Regenerates the measured tables of docs/benchmarks.md and the README's
# comparison table on this machine:
#
#   1. the report, every row: docs/report/report.md and roofline.svg;
#   2. the warm loop against PyTorch: docs/report/warm_loop.md;
#   3. the Python modules against torch.nn: docs/report/python.md, and both
#      under torch.compile: docs/report/python_compiled.md;
#   4. scripts/splice_tables.py puts them into the docs.
#
# Steps 2 and 3 need a Python with torch, and step 3 this package built
# optimised into it (`pip install ./python`); PYTHON names it (default
# python3). Without torch they are skipped and the docs keep the previous
# tables of those steps. About 25 minutes on 2 vCPUs once built; run it on an
# otherwise idle machine, then commit docs/report, docs/benchmarks.md and
# README.md together.
#
# Usage: PYTHON=~/venv/bin/python scripts/benchmarks.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
OUT=docs/report

cargo build --release --example report
cargo run --release --example report -- --markdown "$OUT"
if "$PYTHON" -c "import torch" 2>/dev/null; then
    cargo run --release --example report -- --loop --python "$PYTHON" --markdown "$OUT"
    if "$PYTHON" -c "import embedding_kernels, sys; sys.exit(embedding_kernels._native.OPT_LEVEL in ('0', '1'))" 2>/dev/null; then
        "$PYTHON" python/bench/compare.py --markdown "$OUT/python.md"
        "$PYTHON" python/bench/compare.py --compile --markdown "$OUT/python_compiled.md"
    else
        echo "skipping python/bench/compare.py: $PYTHON has no optimised embedding_kernels (pip install ./python)" >&2
    fi
else
    echo "skipping the warm loop and the Python comparison: $PYTHON has no torch" >&2
fi
python3 scripts/splice_tables.py
