#!/usr/bin/env bash
# Build times for issue 64 ("compiled once"), the table in docs/testing.md:
# what the crate costs to compile, for itself, for a crate that calls it, and
# for a new user. Each row is a wall-clock time in seconds:
#
#   lib     `cargo build --release --lib` after `cargo clean --release -p
#           embedding-kernels`: the library alone, with its dependencies
#           already built (by the same build, run once untimed first)
#   candle  the same with `--features candle`
#   probe   probe/ (a crate that calls every public kernel and layer, for u32
#           and i64 ids and every table format): built once untimed, then
#           `touch src/main.rs` and `cargo build --release` timed, which is
#           what a calling crate compiles of the library's generic code (in
#           the probe's own release profile, as a user's crate would)
#   report  `cargo build --release --example report` in an empty target
#           directory, dependencies included: what a new user waits for before
#           `cargo run --release --example report -- --help` prints anything
#   test    `cargo test --no-run` in an empty target directory, then `cargo
#           test` in the same directory (running the tests, and building and
#           running the doctests); printed as the build, the run, and the two
#           together
#   python  `pip install ./python` (maturin, the release profile: optimised,
#           as a user gets it, where CI builds at opt-level 0) into a fresh
#           virtualenv, with the pip options .ci/run uses, building in an
#           empty target directory; pip fetches maturin into its build
#           environment (from its cache after a first run)
#
# Usage:
#   scripts/build-times.sh                    # every row: about 30 minutes on 2 vCPUs
#   scripts/build-times.sh lib candle probe   # only these rows
#   SKIP_PYTHON=1 scripts/build-times.sh      # every row but python (SKIP_<ROW>=1)
#
# The rows lib, candle and probe share the main target directory, ./target or
# CARGO_TARGET_DIR; report, test and python each build in a fresh temporary
# directory (several GB for report and test) under TMPDIR, removed after.
# Crates are downloaded (`cargo fetch`) before anything is timed. Run it on
# an otherwise idle machine: another build shares the cores, and another cargo
# on the main target directory makes these wait for its lock. Cargo's
# output and each step's time go to stderr; stdout gets the machine, the
# commit and the Markdown table, so `scripts/build-times.sh > times.md` keeps
# just those.

# The table's labels hold Markdown code spans: backticks in single quotes, not
# command substitutions.
# shellcheck disable=SC2016
set -euo pipefail

# The main target directory, made absolute (from where the script was started,
# as cargo would read it) so that the probe, built from its own manifest, uses
# it too.
MAIN_TARGET="${CARGO_TARGET_DIR:-$(dirname "$0")/../target}"
mkdir -p "$MAIN_TARGET"
MAIN_TARGET="$(cd "$MAIN_TARGET" && pwd)"

cd "$(dirname "$0")/.."

ALL_ROWS=(lib candle probe report test python)

# The rows to run: those named, or all; less those whose SKIP_<ROW> is set.
if [ $# -eq 0 ]; then
    set -- "${ALL_ROWS[@]}"
fi
rows=()
for row in "$@"; do
    if [[ " ${ALL_ROWS[*]} " != *" $row "* ]]; then
        echo "unknown row '$row'; the rows are: ${ALL_ROWS[*]}" >&2
        exit 2
    fi
    skip="SKIP_${row^^}"
    if [ -z "${!skip:-}" ]; then
        rows+=("$row")
    fi
done
wants() {
    [[ " ${rows[*]} " == *" $1 "* ]]
}

# Temporary directories, removed however the script ends.
scratch=()
trap 'if [ ${#scratch[@]} -gt 0 ]; then rm -rf "${scratch[@]}"; fi' EXIT
fresh_dir() {
    local dir
    dir="$(mktemp -d "${TMPDIR:-/tmp}/build-times.XXXXXX")"
    scratch+=("$dir")
    FRESH="$dir"
}

# Runs a command (its output to stderr) and sets SECS to its wall-clock time.
SECS=
timed() {
    echo "==> $*" >&2
    local t0 t1
    t0=$(date +%s.%N)
    "$@" >&2
    t1=$(date +%s.%N)
    SECS=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
    echo "<== ${SECS} s" >&2
}

# Runs a command untimed, its output to stderr.
untimed() {
    echo "==> (untimed) $*" >&2
    "$@" >&2
}

# The table's rows, in the order measured.
table=()
record() {
    table+=("| $1 | $2 |")
}

if wants lib || wants candle || wants report || wants test; then
    untimed cargo fetch
fi
if wants probe; then
    untimed cargo fetch --manifest-path probe/Cargo.toml
fi
if wants python; then
    untimed cargo fetch --manifest-path python/Cargo.toml
fi

if wants lib; then
    untimed env CARGO_TARGET_DIR="$MAIN_TARGET" cargo build --release --lib
    untimed env CARGO_TARGET_DIR="$MAIN_TARGET" cargo clean --release -p embedding-kernels
    timed env CARGO_TARGET_DIR="$MAIN_TARGET" cargo build --release --lib
    record '`cargo build --release --lib` (dependencies built)' "$SECS"
fi

if wants candle; then
    untimed env CARGO_TARGET_DIR="$MAIN_TARGET" cargo build --release --lib --features candle
    untimed env CARGO_TARGET_DIR="$MAIN_TARGET" cargo clean --release -p embedding-kernels
    timed env CARGO_TARGET_DIR="$MAIN_TARGET" cargo build --release --lib --features candle
    record '`cargo build --release --lib --features candle` (dependencies built)' "$SECS"
fi

if wants probe; then
    untimed env CARGO_TARGET_DIR="$MAIN_TARGET" cargo build --release --manifest-path probe/Cargo.toml
    touch probe/src/main.rs
    timed env CARGO_TARGET_DIR="$MAIN_TARGET" cargo build --release --manifest-path probe/Cargo.toml
    record 'probe: `cargo build --release` after `touch src/main.rs` (library built)' "$SECS"
fi

if wants report; then
    fresh_dir
    timed env CARGO_TARGET_DIR="$FRESH" cargo build --release --example report
    record '`cargo build --release --example report`, empty target directory' "$SECS"
    rm -rf "$FRESH"
fi

if wants test; then
    fresh_dir
    timed env CARGO_TARGET_DIR="$FRESH" cargo test --no-run
    build=$SECS
    record '`cargo test --no-run`, empty target directory' "$build"
    timed env CARGO_TARGET_DIR="$FRESH" cargo test
    run=$SECS
    record '`cargo test` after it (the tests run, the doctests built and run)' "$run"
    whole=$(awk -v a="$build" -v b="$run" 'BEGIN { printf "%.1f", a + b }')
    record '`cargo test`, empty target directory (the two above)' "$whole"
    rm -rf "$FRESH"
fi

if wants python; then
    fresh_dir
    untimed python3 -m venv "$FRESH/venv"
    untimed "$FRESH/venv/bin/pip" install --quiet --upgrade pip
    timed env CARGO_TARGET_DIR="$FRESH/target" \
        "$FRESH/venv/bin/pip" install --quiet --force-reinstall --no-deps ./python
    record '`pip install ./python`, fresh virtualenv and target directory' "$SECS"
    rm -rf "$FRESH"
fi

# The machine and the commit, then the table.
cpu_field() {
    grep -m1 "^$1[[:space:]]*:" /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'
}
commit="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
if [ "$commit" != unknown ] && ! git diff --quiet HEAD -- 2>/dev/null; then
    commit="$commit (with uncommitted changes)"
fi
echo
echo "Build times, $(date -u '+%Y-%m-%d %H:%M UTC'), \`scripts/build-times.sh ${rows[*]}\`"
echo
echo "* CPU: $(cpu_field 'model name') (family $(cpu_field 'cpu family'), model $(cpu_field model)), $(nproc) threads (nproc)"
echo "* commit: $commit"
echo "* $(rustc --version)"
echo
echo "| what | seconds |"
echo "| --- | ---: |"
if [ ${#table[@]} -gt 0 ]; then
    printf '%s\n' "${table[@]}"
fi
