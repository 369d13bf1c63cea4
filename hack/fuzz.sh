#!/usr/bin/env bash
# A coverage-guided fuzz campaign (atheris, libFuzzer's engine) of one target, its finds merged
# into the committed corpus, which tests/fuzz/test_corpus.py replays in every test run.
#
#   hack/fuzz.sh TARGET [SECONDS]      # TARGET: mutate, validate or rules; SECONDS: 600
#
# The campaign starts from tests/fuzz/corpus/TARGET and the seeds built from examples/ and the
# built-in rules (tests/fuzz/seeds.py), and writes what it finds to a scratch folder. Then
# libFuzzer's -merge=1 keeps the smallest set of inputs, from the corpus, the seeds and the
# finds, that covers every feature any of them covers, and that set replaces the corpus folder.
# A failing input stops the campaign, is written to the scratch folder (printed, and kept) and
# is not merged: fix the bug, copy the input into the corpus folder as a regression, run again.
# Needs atheris (pip install -e '.[dev]'); run it niced on a shared machine.
set -euo pipefail
cd "$(dirname "$0")/.."

target="${1:?usage: hack/fuzz.sh TARGET [SECONDS]   (TARGET: mutate, validate, rules)}"
seconds="${2:-600}"
case "$target" in
    mutate | validate | rules) ;;
    *) echo "unknown target $target: mutate, validate or rules" >&2; exit 2 ;;
esac
python="$(command -v "${PYTHON:-.venv/bin/python}")"
case "$python" in /*) ;; *) python="$PWD/$python" ;; esac  # the wrapper below runs anywhere
corpus="tests/fuzz/corpus/$target"
mkdir -p "$corpus"
work="$(mktemp -d -t "dra-gateway-fuzz-$target.XXXXXX")"
export PYTHONPATH="$PWD/tests${PYTHONPATH:+:$PYTHONPATH}"

# Rule documents are longer than reviews; longer inputs are slower to run, not richer.
max_len=8192
[ "$target" = rules ] && max_len=16384
# libFuzzer's merge runs argv[0] again as a child: an executable that runs the target (run.py).
printf '#!/bin/sh\nexec "%s" -m fuzz.run "%s" "$@"\n' "$python" "$target" > "$work/runner"
chmod +x "$work/runner"
export FUZZ_RUNNER="$work/runner"
fuzz() { "$work/runner" -max_len="$max_len" -timeout=10 -rss_limit_mb=4096 "$@"; }

mkdir -p "$work/seeds" "$work/finds" "$work/merged"
"$python" -m fuzz.seeds "$target" "$work/seeds"
before="$(find "$corpus" -type f | wc -l)"
echo "fuzz $target for ${seconds}s: $before inputs in $corpus, $(find "$work/seeds" -type f | wc -l) seeds; scratch $work"

if ! fuzz -max_total_time="$seconds" -print_final_stats=1 -artifact_prefix="$work/" \
        "$work/finds" "$corpus" "$work/seeds" 2>&1 | tee "$work/campaign.log"; then
    echo "the campaign failed; the failing input and the log are in $work" >&2
    exit 1
fi
if grep -q "^==[0-9]*== ERROR: libFuzzer" "$work/campaign.log"; then
    echo "the campaign found a failing input; it and the log are in $work" >&2
    exit 1
fi

# Regression inputs (regression-*) stay whatever they cover: they start the merged set, which
# then gains only inputs that add features to them.
find "$corpus" -type f -name 'regression-*' -exec cp {} "$work/merged/" \;
fuzz -merge=1 "$work/merged" "$corpus" "$work/seeds" "$work/finds" > "$work/merge.log" 2>&1 || {
    tail -20 "$work/merge.log" >&2; echo "the merge failed; its log is in $work" >&2; exit 1; }
grep -E "MERGE-OUTER: [0-9]+ new files" "$work/merge.log" || true
find "$corpus" -type f -delete
cp "$work/merged"/* "$corpus"/
after="$(find "$corpus" -type f | wc -l)"
echo "fuzz $target: corpus $before -> $after inputs ($(du -sk "$corpus" | cut -f1) KiB) after merging $(find "$work/finds" -type f | wc -l) finds"
rm -rf "$work"
