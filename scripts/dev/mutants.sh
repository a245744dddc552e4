#!/usr/bin/env bash
# Mutation testing of the request path with cargo-mutants: each mutant (an
# operator flipped, a body replaced by a default, a match arm deleted) is built
# and the tests of its crate run against it; a mutant they do not catch is a
# test that is missing, or an equivalent change (say which in docs/testing.md).
# Not in CI: the whole list takes hours on 2 cores. Partial results stay in the
# output folder when the time budget runs out.
#
#   scripts/dev/mutants.sh [MINUTES] [FILE...]
#   MUTANTS_TEST_ARGS=--lib scripts/dev/mutants.sh 30 crates/tickserve-edge/src/params.rs
#
# MINUTES (default 60) bounds the run; FILEs default to the request path below.
# MUTANTS_TEST_ARGS go to `cargo test` (`--lib`: the unit tests only, for the
# server crate, whose integration tests need the Python side the copy lacks).
# MUTANTS_ARGS go to cargo-mutants itself (`--re`/`--exclude-re` to pick lines).
# Results: target/mutants/mutants.out/{caught,missed,timeout,unviable}.txt.
set -euo pipefail
cd "$(dirname "$0")/../.."

minutes=${1:-60}
shift || true
files=("$@")
if [ ${#files[@]} -eq 0 ]; then
    files=(
        crates/tickserve-core/src/validate.rs
        crates/tickserve-core/src/buckets.rs
        crates/tickserve-core/src/durations.rs
        crates/tickserve-edge/src/params.rs
        crates/tickserve-server/src/transport/routes.rs
        crates/tickserve-server/src/transport/access.rs
        crates/tickserve-runtime/src/admission.rs
        crates/tickserve-runtime/src/batcher.rs
        crates/tickserve-runtime/src/worker.rs
        crates/tickserve-shm-protocol/src/lib.rs
        crates/tickserve-server/src/tfserving/json.rs
    )
fi

command -v cargo-mutants >/dev/null || cargo install --locked cargo-mutants
scripts/setup.sh
export TICKSERVE_ONNXRUNTIME_LIBRARY="$PWD/.local/lib/libonnxruntime.so.1.31.1"
export LD_LIBRARY_PATH="$PWD/.local/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# A target folder of its own: the mutated copies never share artifacts with
# the working tree's builds.
export CARGO_TARGET_DIR="$PWD/target/mutants/build"

args=()
for f in "${files[@]}"; do args+=(--file "$f"); done
status=0
read -r -a test_args <<< "${MUTANTS_TEST_ARGS:-}"
read -r -a mutants_args <<< "${MUTANTS_ARGS:-}"
extra=()
if [ ${#test_args[@]} -gt 0 ]; then extra=(-- "${test_args[@]}"); fi
timeout "${minutes}m" cargo mutants --no-shuffle --cap-lints true \
    --output target/mutants "${args[@]}" ${mutants_args[@]+"${mutants_args[@]}"} "${extra[@]}" || status=$?
out=target/mutants/mutants.out
for outcome in caught missed timeout unviable; do
    printf '%-9s %s\n' "$outcome" "$( (cat "$out/$outcome.txt" 2>/dev/null || true) | wc -l)"
done
if [ -s "$out/missed.txt" ]; then
    echo "missed:"
    cat "$out/missed.txt"
fi
# 124: the time budget ran out (the counts above are what finished); 2: some
# mutants were missed; 3: some timed out.
exit "$status"
