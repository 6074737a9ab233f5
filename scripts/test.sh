#!/usr/bin/env bash
# The test command: set up (idempotent), then run the whole suite as root.
# Extra arguments go to pytest, e.g. scripts/test.sh -k fabric
#
# Two passes: the tests that need no root (statistics on synthetic streams, parsing, models) on
# both CPUs (pytest-xdist; worksteal: a worker that runs out takes tests queued on the other, so
# the minute-long false-alarm tests do not leave one CPU idle at the end), then the root tests
# (real fabrics and jobs, some timing-sensitive) one at a time. Both always run; the exit status
# is the first pass's failure, else the second's.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$here/scripts/setup.sh"
cd "$here"
py="$here/.venv/bin/python"
common=(-q -p no:cacheprovider --timeout=900)
set +e
"$py" -m pytest "${common[@]}" -n 2 --dist worksteal -m "not root" tests "$@"
first=$?
"$py" -m pytest "${common[@]}" -m root tests "$@"
second=$?
set -e
# 5: nothing selected in that pass (e.g. a -k that names only root tests): not a failure if the other ran
if [ "$first" -eq 5 ] && [ "$second" -ne 5 ]; then first=0; fi
if [ "$second" -eq 5 ] && [ "$first" -ne 5 ]; then second=0; fi
if [ "$first" -ne 0 ]; then exit "$first"; fi
exit "$second"
