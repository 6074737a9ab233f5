#!/usr/bin/env bash
# The main job: set up (idempotent), then `flowpulse demo`: build the default
# fabric, run a real 8-rank gloo allreduce, switch on a silent 1% drop on a
# random leaf-spine link, and show the agents catching and localizing it.
# Extra arguments go to `flowpulse demo` (e.g. --seed 3, --rate 0.005).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$here/scripts/setup.sh"
cd "$here"
exec "$here/.venv/bin/flowpulse" demo "$@"
