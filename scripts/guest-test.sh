#!/usr/bin/env bash
# The optional third command: the project's tests on Debian's stock kernel in an emulated guest.
# Installs what it needs (idempotent), fetches the kernel whose headers scripts/setup.sh installed
# for BCC (its image and headers, unpacked into a cache, not installed), boots it under qemu with
# this machine's root shared read-only, runs tests/test_netem.py (or the pytest arguments after --)
# as root and prints pytest's summary.
#   sudo scripts/guest-test.sh
#   sudo scripts/guest-test.sh -- tests/test_netem.py -k drop
#   sudo scripts/guest-test.sh --setup-only    # install what the guest needs, then stop (scripts/test.sh)
# Exit status: pytest's; 2 bad input; 3 the guest could not run (one line says what is missing).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ "$(id -u)" -ne 0 ]; then
    echo "guest-test: run as root (sudo scripts/guest-test.sh): the guest shares this machine's root filesystem" >&2
    exit 3
fi
"$here/scripts/setup.sh"
need=()
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
[ -x /bin/busybox ] || need+=(busybox-static)
command -v cpio >/dev/null || need+=(cpio)
command -v depmod >/dev/null || need+=(kmod)
if [ ${#need[@]} -gt 0 ]; then
    echo "guest-test: installing ${need[*]}" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" >&2
fi
if [ "${1:-}" = "--setup-only" ]; then exit 0; fi
cd "$here"
exec "$here/.venv/bin/python" -m guest "$@"
