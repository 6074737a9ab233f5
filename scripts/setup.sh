#!/usr/bin/env bash
# Idempotent set-up for FlowPulse on Debian/Ubuntu, run as root.
# Installs the system packages (BCC, clang, kernel headers, iproute2, ethtool, Prometheus),
# makes BCC find headers on kernels without their own, and builds the project's
# virtualenv (.venv) with CPU torch, pyroute2, scapy and the rest, and compiles the
# site agent's counting object (netns_testbed/bpf/count.bpf.o) with clang.
# Safe to run again: each step checks before it acts.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${FLOWPULSE_VENV:-$here/.venv}"
log() { echo "setup: $*" >&2; }

if [ "$(id -u)" -ne 0 ]; then
    echo "setup: must run as root (network namespaces and eBPF need it): rerun with sudo" >&2
    exit 1
fi

# --- system packages -------------------------------------------------------
pkgs=(bpfcc-tools python3-bpfcc libbpf1 libbpf-dev clang iproute2 ethtool prometheus prometheus-alertmanager python3-venv iperf3 iputils-ping)
if ! [ -d "/lib/modules/$(uname -r)/build" ]; then
    # Distribution headers for the running kernel if they exist, else the
    # distribution's generic ones (tc programs use only stable uapi structs).
    if apt-cache show "linux-headers-$(uname -r)" >/dev/null 2>&1; then
        pkgs+=("linux-headers-$(uname -r)")
    else
        pkgs+=(linux-headers-amd64)
    fi
fi
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
    log "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >&2
    apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
    # Debian starts the prometheus service on install; the tests start their own.
    if command -v systemctl >/dev/null 2>&1; then
        systemctl disable --now prometheus prometheus-alertmanager >/dev/null 2>&1 || true
    fi
fi

# --- kernel headers for BCC --------------------------------------------------
# Kernels without installed headers (VMs, custom builds): point BCC's Debian
# split-header logic at the distribution's headers (build = -amd64, source = -common).
kdir="/lib/modules/$(uname -r)"
if ! [ -e "$kdir/build" ]; then
    arch_dir=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -n 1 || true)
    common_dir=$(ls -d /usr/src/linux-headers-*-common 2>/dev/null | sort -V | tail -n 1 || true)
    if [ -z "$arch_dir" ] || [ -z "$common_dir" ]; then
        echo "setup: no kernel headers under /usr/src: install linux-headers-amd64" >&2
        exit 1
    fi
    log "linking $kdir/build -> $arch_dir, source -> $common_dir"
    mkdir -p "$kdir"
    ln -sfn "$arch_dir" "$kdir/build"
    ln -sfn "$common_dir" "$kdir/source"
fi

# --- virtualenv --------------------------------------------------------------
py="${FLOWPULSE_PYTHON:-python3}"
if ! [ -x "$venv/bin/python" ]; then
    log "creating $venv"
    "$py" -m venv "$venv"
fi
stamp="$venv/.flowpulse-req"
req_hash=$(cat "$here/requirements.txt" "$here/setup.cfg" | sha256sum | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$req_hash" ]; then
    log "installing Python requirements (torch CPU build, pyroute2, scapy, ...)"
    "$venv/bin/pip" install -q --disable-pip-version-check -r "$here/requirements.txt" >&2
    "$venv/bin/pip" install -q --disable-pip-version-check --no-deps -e "$here" >&2
    echo "$req_hash" > "$stamp"
fi

# BCC is not on PyPI: expose only the distribution's bcc package to the venv
# (not the whole dist-packages, whose other modules would shadow the venv's).
bcc_dir=$("/usr/bin/python3" -c 'import bcc, os; print(os.path.dirname(bcc.__file__))')
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p "$venv/bcc-shim"
ln -sfn "$bcc_dir" "$venv/bcc-shim/bcc"
echo "$venv/bcc-shim" > "$site/flowpulse-bcc.pth"
"$venv/bin/python" -c 'import bcc' || { echo "setup: bcc not importable from $venv: install python3-bpfcc" >&2; exit 1; }

# --- the site agent's counting object (clang, once; loaded with libbpf) ------
if ! "$venv/bin/python" -m netns_testbed.bpfobject --check >/dev/null 2>&1; then
    log "building netns_testbed/bpf/count.bpf.o"
    (cd "$here" && "$venv/bin/python" -m netns_testbed.bpfobject >/dev/null)
fi
log "ready: $venv"
