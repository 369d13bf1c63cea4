#!/usr/bin/env bash
# Re-resolve every dependency (runtime and dev) to its newest release and write the result to
# constraints.txt, the versions the README's test command and CI install. Run it when you mean
# to move to newer versions, then run the tests, and commit both together.
#
#   hack/update-constraints.sh            # writes constraints.txt
set -euo pipefail
cd "$(dirname "$0")/.."
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q --upgrade pip
"$work/venv/bin/pip" install -q -e '.[dev]'
{
    echo "# The versions CI and the README's test command install (pip install -c constraints.txt)."
    echo "# Written by hack/update-constraints.sh on $(date -u +%Y-%m-%d) with $("$work/venv/bin/python" --version)."
    echo "# pyproject.toml keeps the ranges users install from; hack/test-newest.sh tests those."
    "$work/venv/bin/pip" freeze --exclude-editable | grep -v '^#' | LC_ALL=C sort -f
} > constraints.txt
echo "wrote constraints.txt ($(grep -vc '^#' constraints.txt) packages)"
