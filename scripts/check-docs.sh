#!/usr/bin/env bash
# Keeps the docs a reference (run by .ci/run): fails when a file of docs/
# grows past its size limit, or when src/ names a date or a particular host.
# Measurements belong in docs/runs/ (excluded here) and docs/report/ (written
# by the tools); history in git. Prints each file's size against its limit.
set -euo pipefail
cd "$(dirname "$0")/.."

# Lines allowed per file; a docs/*.md file not listed may hold up to 400.
declare -A LIMIT=([docs/benchmarks.md]=800 [docs/design.md]=1500 [docs/testing.md]=400)
DEFAULT_LIMIT=400

failed=0
printf '%-22s %6s %6s\n' file lines limit
for file in docs/*.md; do
    lines=$(wc -l <"$file")
    limit=${LIMIT[$file]:-$DEFAULT_LIMIT}
    mark=""
    if [ "$lines" -gt "$limit" ]; then
        mark="  over the limit"
        failed=1
    fi
    printf '%-22s %6d %6d%s\n' "$file" "$lines" "$limit" "$mark"
done

# A date (2026-11-30), an AMD core or family name, an Intel host: code
# comments say what and why, and a measurement's figures stay in docs/.
pattern='20[0-9]{2}-[01][0-9]-[0-3][0-9]|Zen ?[0-9]|family [0-9]+|Intel host|AMD host|EPYC|Xeon'
if git grep -nE "$pattern" -- 'src/*.rs' 'src/**/*.rs'; then
    echo "src/ names a date or a host (above): move the measurement to docs/, keep the reason"
    failed=1
fi
exit "$failed"
