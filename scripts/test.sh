#!/usr/bin/env bash
# The test command: set up (idempotent), then run the whole suite as root.
# Extra arguments go to pytest, e.g. scripts/test.sh -k fabric
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$here/scripts/setup.sh"
cd "$here"
exec "$here/.venv/bin/python" -m pytest -q -p no:cacheprovider --timeout=900 tests "$@"
