"""A distribution kernel for the guest: its image and headers fetched by package name and unpacked
(never installed here), its modules indexed, and a busybox initramfs that mounts the host's root over 9p
with a tmpfs overlay."""
from __future__ import annotations

import gzip
import lzma
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from netns_testbed.errors import EnvironmentProblem, SpecError

# Loaded by the initramfs, in this order, to reach the shared root (Debian 6.1 builds them as modules).
INITRAMFS_MODULES = ("virtio_ring", "virtio", "virtio_pci_modern_dev", "virtio_pci_legacy_dev", "virtio_pci",
                     "9pnet", "9pnet_virtio", "netfs", "fscache", "9p", "overlay")
# what the guest's root needs in every kernel; the others are their dependencies in some kernel (fscache is
# part of netfs from 6.12 on): one missing that nothing in the kernel's modules.dep needs is left out
ROOT_MODULES = {"virtio_pci", "9pnet_virtio", "9p", "overlay"}
BUSYBOX = Path("/bin/busybox")
# Debian's names: 6.1.0-57-amd64 (the release's own ABI number), 6.12.107+deb12-amd64 (a newer kernel built for it)
VERSION_RE = re.compile(r"^[0-9]+\.[0-9]+\.[0-9]+(-[0-9]+|\+deb[0-9]+)-[a-z0-9]+$")

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
    """An unpacked kernel and its headers: ``root`` holds ``boot/``, ``lib/modules/<version>/`` and ``usr/``
    (``src/linux-headers-*``, ``lib/linux-kbuild-*``)."""

    version: str
    root: Path

    @property
    def vmlinuz(self) -> Path:
        return self.root / "boot" / f"vmlinuz-{self.version}"

    @property
    def modules(self) -> Path:
        return self.root / "lib" / "modules" / self.version

    @property
    def headers(self) -> Path:
        """The headers BCC compiles against in the guest (``/lib/modules/<version>/build`` points there)."""
        return self.root / "usr" / "src" / f"linux-headers-{self.version}"

    def complete(self) -> bool:
        """Whether the image, its module index and the headers are all unpacked (a cache from before the
        headers came from here has only the first two, and is fetched again)."""
        return (self.modules / "modules.dep").exists() and self.vmlinuz.exists() and (self.headers / "Makefile").exists()

    def builtin(self, name: str) -> bool:
        """Whether the kernel has ``name`` built in (modules.builtin: 6.12's virtio, for one), no .ko to load."""
        listed = self.modules / "modules.builtin"
        return listed.exists() and any(line.rsplit("/", 1)[-1] == f"{name}.ko"
                                       for line in listed.read_text().splitlines())

    @cached_property
    def deps(self) -> dict[str, list[str]] | None:
        """This kernel's modules.dep, parsed once: module -> the modules it needs (None: no such file)."""
        dep = self.modules / "modules.dep"
        if not dep.exists():
            return None

        def base(path: str) -> str:
            return path.rsplit("/", 1)[-1].split(".ko")[0]
        out: dict[str, list[str]] = {}
        for line in dep.read_text().splitlines():
            head, _, rest = line.partition(":")
            out[base(head)] = [base(x) for x in rest.split()]
        return out

    def needed(self, name: str) -> bool:
        """Whether the guest must load ``name``: one of ROOT_MODULES, or a dependency of a module in this
        kernel's modules.dep (without one, every listed module is)."""
        if name in ROOT_MODULES or self.deps is None:
            return True
        return any(name in needs for needs in self.deps.values())

    def load_order(self, names: tuple[str, ...]) -> list[str]:
        """``names`` with each module after the ones it depends on in this kernel's modules.dep (6.12's
        9pnet needs netfs, 6.1's does not); the given order where nothing says otherwise."""
        deps = self.deps or {}
        out: list[str] = []

        def visit(n: str) -> None:
            if n in out:
                return
            for d in deps.get(n, []):
                if d in names:
                    visit(d)
            out.append(n)

        for n in names:
            visit(n)
        return out

    def module(self, name: str) -> Path:
        """The module's file: ``name.ko``, or ``name.ko.xz`` as Debian packs 6.12's."""
        hits = list(self.modules.rglob(f"{name}.ko")) or list(self.modules.rglob(f"{name}.ko.xz"))
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
        raise SpecError(f"bad kernel version {version!r}: write it as Debian names it, e.g. 6.1.0-57-amd64 or "
                        "6.12.107+deb12-amd64")
    return version


# The headers package's own dependencies that hold files BCC reads: the arch-independent headers and kbuild's
# scripts (the image, gcc and linux-base it also depends on are not needed in the guest).
HEADER_DEPS = re.compile(r"(?<![\w.+-])(linux-headers-[0-9][^\s,|()]*-common|linux-kbuild-[0-9][^\s,|()]*)")


def header_packages(depends: str) -> list[str]:
    """From ``linux-headers-<version>``'s Depends field, the packages its headers point into (-common, kbuild)."""
    return sorted(set(HEADER_DEPS.findall(depends)))


def _download(pkgs: list[str], into: Path) -> list[Path]:
    """``apt-get download`` each package into ``into`` (apt's sandbox user would not be able to write there)."""
    r = subprocess.run(["apt-get", "download", "-q", "-o", "APT::Sandbox::User=root", *pkgs], cwd=into,
                       capture_output=True, text=True)
    debs = [next(iter(into.glob(f"{pkg}_*.deb")), None) for pkg in pkgs]
    if r.returncode != 0 or None in debs:
        msg = (r.stderr.strip().splitlines() or ["apt-get download failed"])[-1]
        raise EnvironmentProblem(f"cannot download {' '.join(pkgs)} ({msg}): check apt's sources or pick another --kernel")
    return debs


def fetch(version: str, cache: Path, log=print) -> KernelTree:
    """The kernel's image and its headers, downloaded with apt, unpacked and depmod'ed under ``cache``
    (once). Nothing is installed on this machine: ``linux-headers-<version>`` depends on the kernel's image
    (and through it udev and initramfs-tools), so installing the headers for a guest would install a second
    kernel here; unpacked into the cache, they are mounted over ``/usr/src`` in the guest only."""
    tree = KernelTree(version, cache / version)
    if tree.complete():
        return tree
    cache.mkdir(parents=True, exist_ok=True)
    dl = cache / "download"
    shutil.rmtree(dl, ignore_errors=True)
    dl.mkdir()
    image, headers = f"linux-image-{version}", f"linux-headers-{version}"
    log(f"guest: downloading {image} and {headers}")
    staging = cache / f".{version}.unpacking"
    try:
        debs = _download([image, headers], dl)
        depends = subprocess.run(["dpkg-deb", "-f", str(debs[1]), "Depends"], capture_output=True, text=True,
                                 check=True).stdout
        more = header_packages(depends)
        if not any(p.endswith("-common") for p in more):
            raise EnvironmentProblem(f"{headers} depends on no linux-headers-*-common ({depends.strip()[:200]}): "
                                     "not a Debian kernel's headers package")
        debs += _download(more, dl)
        shutil.rmtree(staging, ignore_errors=True)
        for deb in debs:
            subprocess.run(["dpkg-deb", "-x", str(deb), str(staging)], check=True)
        subprocess.run(["depmod", "-b", str(staging), version], check=True)
        shutil.rmtree(tree.root, ignore_errors=True)
        os.replace(staging, tree.root)
    finally:
        shutil.rmtree(dl, ignore_errors=True)
        shutil.rmtree(staging, ignore_errors=True)
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
    order = tree.load_order(INITRAMFS_MODULES)
    for m in order:
        if tree.builtin(m) or not (tree.needed(m) or list(tree.modules.rglob(f"{m}.ko*"))):
            continue                     # (init loads the ones it finds)
        src, dst = tree.module(m), root / "mods" / f"{m}.ko"
        if src.suffix == ".xz":          # busybox's insmod takes them uncompressed
            dst.write_bytes(lzma.decompress(src.read_bytes()))
        else:
            shutil.copy2(src, dst)
    init = root / "init"
    init.write_text(INIT % {"modules": " ".join(order)})
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
