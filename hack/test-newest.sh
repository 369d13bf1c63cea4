#!/usr/bin/env bash
# Run the test suite against the newest release of every dependency, as a plain
# `pip install dra-gateway` gets today, ignoring constraints.txt. Run it before each submission:
# a failure here is a break users will meet that the pinned CI cannot see. Prints what differs
# from constraints.txt, then runs pytest with any arguments given.
#
#   hack/test-newest.sh                   # the whole suite
#   hack/test-newest.sh tests/kube -x     # a part of it
set -euo pipefail
cd "$(dirname "$0")/.."
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q --upgrade pip
"$work/venv/bin/pip" install -q -e '.[dev]'
"$work/venv/bin/pip" freeze --exclude-editable | grep -v '^#' | LC_ALL=C sort -f > "$work/newest.txt"
echo "newest releases that differ from constraints.txt:"
diff <(grep -v '^#' constraints.txt) "$work/newest.txt" | sed -n 's/^> /  /p' || true
"$work/venv/bin/python" -m pytest "$@"
