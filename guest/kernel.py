"""A distribution kernel for the guest: fetched by package name, unpacked, its modules indexed,
and a busybox initramfs that mounts the host's root over 9p with a tmpfs overlay."""
from __future__ import annotations

import gzip
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from netns_testbed.errors import EnvironmentProblem, SpecError

# Loaded by the initramfs, in this order, to reach the shared root (Debian 6.1 builds them as modules).
INITRAMFS_MODULES = ("virtio_ring", "virtio", "virtio_pci_modern_dev", "virtio_pci_legacy_dev", "virtio_pci",
                     "9pnet", "9pnet_virtio", "netfs", "fscache", "9p", "overlay")
BUSYBOX = Path("/bin/busybox")
VERSION_RE = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+-[0-9]+-[a-z0-9]+$")

INIT = r"""#!/bin/busybox sh
# flowpulse guest initramfs: the host's / (9p, read-only) under a tmpfs overlay, the results share, then run.sh
B=/bin/busybox
$B mkdir -p /proc /sys /dev /lower /rw /newroot
$B mount -t proc proc /proc
$B mount -t devtmpfs dev /dev
for m in %(modules)s; do
    [ -f /mods/$m.ko ] && $B insmod /mods/$m.ko
done
fail() { echo "flowpulse-guest: $*"; echo "FLOWPULSE-GUEST-FAILED"; $B poweroff -f; }
$B mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=262144 hostroot /lower || fail "cannot mount the host's root"
$B mount -t tmpfs -o size=3g tmpfs /rw
$B mkdir -p /rw/upper /rw/work
$B mount -t overlay overlay -o lowerdir=/lower,upperdir=/rw/upper,workdir=/rw/work /newroot || fail "no overlay"
$B mkdir -p /newroot/flowpulse-guest
$B mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 results /newroot/flowpulse-guest || fail "cannot mount the results share"
$B umount /proc
exec $B switch_root /newroot /bin/bash /flowpulse-guest/run.sh
"""


@dataclass(frozen=True)
class KernelTree:
    """An unpacked kernel package: ``root`` holds ``boot/`` and ``lib/modules/<version>/``."""

    version: str
    root: Path

    @property
    def vmlinuz(self) -> Path:
        return self.root / "boot" / f"vmlinuz-{self.version}"

    @property
    def modules(self) -> Path:
        return self.root / "lib" / "modules" / self.version

    def module(self, name: str) -> Path:
        hits = list(self.modules.rglob(f"{name}.ko"))
        if not hits:
            raise EnvironmentProblem(f"kernel {self.version} has no module {name}.ko: the guest cannot mount its root")
        return hits[0]


def default_version() -> str:
    """The kernel whose headers the project's set-up installed for BCC (``linux-headers-amd64``'s)."""
    r = subprocess.run(["dpkg-query", "-W", "-f", "${Depends}", "linux-headers-amd64"], capture_output=True, text=True)
    m = re.search(r"linux-headers-([0-9][^ ,]*-amd64)", r.stdout)
    if r.returncode != 0 or not m:
        raise EnvironmentProblem("linux-headers-amd64 is not installed: run scripts/setup.sh first")
    return m.group(1)


def check_version(version: str) -> str:
    if not VERSION_RE.match(version):
        raise SpecError(f"bad kernel version {version!r}: write it as Debian names it, e.g. 6.1.0-57-amd64")
    return version


def headers_for(version: str) -> Path:
    """The headers BCC compiles against inside the guest (``/lib/modules/<version>/build``)."""
    build = Path("/usr/src") / f"linux-headers-{version}"
    if not build.is_dir():
        raise EnvironmentProblem(f"no headers for {version} on this machine: apt-get install linux-headers-{version}")
    return build


def fetch(version: str, cache: Path, log=print) -> KernelTree:
    """``linux-image-<version>`` downloaded with apt, unpacked and depmod'ed under ``cache`` (once)."""
    tree = KernelTree(version, cache / version)
    if (tree.modules / "modules.dep").exists() and tree.vmlinuz.exists():
        return tree
    cache.mkdir(parents=True, exist_ok=True)
    pkg = f"linux-image-{version}"
    dl = cache / "download"
    shutil.rmtree(dl, ignore_errors=True)
    dl.mkdir()
    log(f"guest: downloading {pkg}")
    r = subprocess.run(["apt-get", "download", "-q", "-o", "APT::Sandbox::User=root", pkg], cwd=dl,
                       capture_output=True, text=True)
    debs = list(dl.glob(f"{pkg}_*.deb"))
    if r.returncode != 0 or not debs:
        msg = (r.stderr.strip().splitlines() or ["apt-get download failed"])[-1]
        raise EnvironmentProblem(f"cannot download {pkg} ({msg}): check apt's sources or pick another --kernel")
    staging = cache / f".{version}.unpacking"
    shutil.rmtree(staging, ignore_errors=True)
    subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(staging)], check=True)
    subprocess.run(["depmod", "-b", str(staging), version], check=True)
    shutil.rmtree(tree.root, ignore_errors=True)
    os.replace(staging, tree.root)
    shutil.rmtree(dl, ignore_errors=True)
    return tree


def initramfs(tree: KernelTree, out: Path) -> Path:
    """A gzipped cpio with a static busybox, :data:`INIT` and the modules that reach the shared root."""
    if not BUSYBOX.exists():
        raise EnvironmentProblem(f"{BUSYBOX} missing: apt-get install busybox-static")
    root = out.with_suffix(".d")
    shutil.rmtree(root, ignore_errors=True)
    (root / "bin").mkdir(parents=True)
    (root / "mods").mkdir()
    shutil.copy2(BUSYBOX, root / "bin" / "busybox")
    for m in INITRAMFS_MODULES:
        shutil.copy2(tree.module(m), root / "mods" / f"{m}.ko")
    init = root / "init"
    init.write_text(INIT % {"modules": " ".join(INITRAMFS_MODULES)})
    init.chmod(0o755)
    names = sorted(str(p.relative_to(root)) for p in root.rglob("*"))
    listing = ("\n".join(["."] + names) + "\n").encode()
    r = subprocess.run(["cpio", "-o", "-H", "newc", "--quiet"], cwd=root, input=listing, capture_output=True)
    if r.returncode != 0:
        raise EnvironmentProblem(f"cpio failed: {r.stderr.decode().strip()[-200:]}")
    with gzip.open(out, "wb", compresslevel=1) as f:
        f.write(r.stdout)
    shutil.rmtree(root)
    return out
