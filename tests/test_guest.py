"""The guest runner's pieces that need no guest: input checks, the initramfs it builds, qemu's argv.
(Booting is the test command's third pass, `scripts/guest-test.sh`, not a test of this suite.)"""
from __future__ import annotations

import gzip
import shlex
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from guest import kernel, vm
from guest.__main__ import main
from netns_testbed.errors import SpecError

REPO = Path(__file__).resolve().parent.parent


def fake_tree(tmp_path: Path) -> kernel.KernelTree:
    tree = kernel.KernelTree("6.1.0-57-amd64", tmp_path / "k")
    for m in kernel.INITRAMFS_MODULES:
        d = tree.modules / "kernel" / "misc"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{m}.ko").write_bytes(b"\x7fELF" + m.encode())
    (tree.root / "boot").mkdir(parents=True)
    tree.vmlinuz.write_bytes(b"kernel")
    return tree


def test_bad_input_is_one_line_and_exit_2(capsys):
    for argv in (["--cpus", "0"], ["--mem", "10"], ["--timeout", "5"], ["--kernel", "6.1; rm -rf /"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("guest-test: bad"), (argv, err)
    with pytest.raises(SpecError, match="e.g. 6.1.0-57-amd64"):
        kernel.check_version("latest")
    assert kernel.check_version("6.1.0-57-amd64") == "6.1.0-57-amd64"
    assert kernel.check_version("6.12.107+deb12-amd64") == "6.12.107+deb12-amd64"
    for bad in ("6.12.107+deb12", "6.12.107+deb12-amd64;reboot", "../6.1.0-57-amd64"):
        with pytest.raises(SpecError):
            kernel.check_version(bad)


def test_keep_must_be_a_directory(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("x")
    assert main(["--keep", str(f)]) == 2
    assert "not a directory" in capsys.readouterr().err


def test_not_root_is_told_to_use_sudo():
    drop = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if os.geteuid() == 0 else []
    if drop and subprocess.run([*drop, sys.executable, "-c", "import guest.__main__"], cwd=REPO,
                               capture_output=True).returncode != 0:
        pytest.skip("user nobody cannot read this checkout (one under /root): the refusal is checked from a "
                    "checkout others can read, as CI's clone in /tmp")
    r = subprocess.run([*drop, sys.executable, "-m", "guest"], cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 3 and r.stderr.strip().splitlines() == [
        "guest-test: the guest runs its tests as root over the host's root filesystem: run with sudo"], r.stderr


@pytest.mark.skipif(not kernel.BUSYBOX.exists(), reason="busybox-static not installed (scripts/test.sh and scripts/guest-test.sh install it)")
def test_initramfs_holds_busybox_init_and_the_modules_in_order(tmp_path):
    tree = fake_tree(tmp_path)
    out = kernel.initramfs(tree, tmp_path / "initrd.gz")
    listing = subprocess.run(["cpio", "-t", "--quiet"], input=gzip.decompress(out.read_bytes()),
                             capture_output=True).stdout.decode().split()
    assert {"init", "bin/busybox"} <= set(listing)
    assert {f"mods/{m}.ko" for m in kernel.INITRAMFS_MODULES} <= set(listing)
    assert not (tmp_path / "initrd.d").exists()
    init = kernel.INIT % {"modules": " ".join(kernel.INITRAMFS_MODULES)}
    assert "for m in virtio_ring virtio " in init and "switch_root /newroot /bin/bash /flowpulse-guest/run.sh" in init


def test_missing_module_names_itself(tmp_path):
    tree = fake_tree(tmp_path)
    (tree.modules / "kernel" / "misc" / "9p.ko").unlink()
    with pytest.raises(kernel.EnvironmentProblem, match="no module 9p.ko"):
        tree.module("9p")


def test_qemu_argv_shares_root_read_only_and_has_no_network(tmp_path, monkeypatch):
    monkeypatch.setattr(vm.shutil, "which", lambda name: "/usr/bin/" + name)
    tree = fake_tree(tmp_path)
    argv = vm.qemu_argv(tree, tmp_path / "initrd.gz", tmp_path / "share", 2, 3072)
    text = " ".join(argv)
    assert "-nic none" in text and "-cpu max" in text and "-enable-kvm" not in text
    assert "local,path=/,mount_tag=hostroot,security_model=none,readonly=on" in text
    assert f"local,path={tmp_path / 'share'},mount_tag=results" in text
    monkeypatch.setattr(vm.shutil, "which", lambda name: None)
    with pytest.raises(vm.EnvironmentProblem, match="apt-get install qemu-system-x86"):
        vm.qemu_argv(tree, tmp_path / "initrd.gz", tmp_path / "share", 2, 3072)


def test_run_script_reads_pytest_arguments_as_lines_never_through_a_shell():
    text = vm.run_script("/k", "/r", "/r/.venv/bin/python", 0.05)
    assert 'mapfile -t args < $R/pytest.args' in text and '"${args[@]}"' in text
    assert "rc=$?" in text and "echo $rc > $R/rc" in text
    # a failed run's test directories (in the guest's tmpfs) are copied to the share before power-off
    assert text.index("cp -a /run/tmp/pytest-of-root $R/pytest-tmp") < text.index("echo $rc > $R/rc")
    # the guest's pace against the host's, exported before pytest starts
    slow = text.index("export FLOWPULSE_SLOWDOWN=$(/r/.venv/bin/python -m netns_testbed.slowdown --against 0.0500)")
    assert slow < text.index("-m pytest")
    # the kernel's messages are kept (the console shows only critical ones) and what it killed is named
    # in the guest's log: a rank killed by the OOM killer read only "exit -9" before
    assert text.index("-m pytest") < text.index("dmesg > $R/dmesg.log") < text.index("echo $rc > $R/rc")
    assert "grep -i 'killed process' $R/dmesg.log | sed 's/^/guest: kernel: /'" in text
    # each finished test's outcome goes to the share as it happens (the matrix's --resume records them)
    assert '-m pytest -q -p no:cacheprovider --report-log=$R/report.jsonl "${args[@]}"' in text


def test_kernel_matrix_gives_the_guest_its_memory_passes_its_progress_on_and_names_what_the_kernel_killed(
        tmp_path, monkeypatch, capsys):
    """The matrix runs the guest runner (here a stand-in script at its path): the memory flag reaches it,
    the runner's progress lines are passed on, and what the guest's kernel killed is named."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("kernel_matrix", Path(__file__).resolve().parents[1] / "bench" / "kernel_matrix.py")
    km = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(km)
    (tmp_path / "scripts").mkdir()
    runner = tmp_path / "scripts" / "guest-test.sh"
    runner.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$(dirname "$0")/argv"\n'
                      'echo "guest: 5 min: 40 tests done (30%): 40 passed" >&2\n'
                      'echo "guest: kernel: [  301.2] Out of memory: Killed process 812 (python) total-vm:1200000kB" >&2\n'
                      'echo "guest 6.12.107+deb12-amd64: 1 failed in 372.00s (0:06:12) (390 s in the guest)"\nexit 1\n')
    runner.chmod(0o755)
    monkeypatch.setattr(km, "ROOT", tmp_path)
    row = km.run("6.12.107+deb12-amd64", ["tests/test_localize_live.py"], 600, None, 6144)
    argv = (tmp_path / "scripts" / "argv").read_text().splitlines()
    assert argv[argv.index("--mem") + 1] == "6144" and argv.index("--mem") < argv.index("--")
    assert row["failed"] == 1 and row["hook"] == "tcx" and row["rc"] == 1
    err = capsys.readouterr().err
    assert "kernel_matrix: 6.12.107+deb12-amd64: 5 min: 40 tests done (30%): 40 passed\n" in err
    assert "kernel_matrix: 6.12.107+deb12-amd64: kernel: [  301.2] Out of memory: Killed process 812" in err


def test_a_running_pytest_s_progress_is_read_from_its_log():
    log = ("........................................................................ [ 41%]\n"
           "....F.....s.E.x\n")
    n, pct = vm.progress(log)
    assert n == {"passed": 84, "failed": 1, "errors": 1, "skipped": 1} and pct == 41     # an xfail counts as passed
    assert vm.progress_line(n, pct, 12.4) == "guest: 12 min: 87 tests done (41%): 84 passed, 1 failed, 1 errors, 1 skipped"
    done = log + ".. [100%]\n\n=== short test summary info ===\nFAILED tests/test_x.py::test_y - assert\n" \
                 "1 failed, 85 passed, 1 skipped, 1 xfailed, 1 error in 5.00s\n"
    assert vm.progress(done) == ({"passed": 86, "failed": 1, "errors": 1, "skipped": 1}, 100)
    assert vm.progress("") == ({"passed": 0, "failed": 0, "errors": 0, "skipped": 0}, None)


def test_the_run_script_hides_nothing_a_checkout_under_tmp_needs():
    """CI clones into /tmp: the guest must see a checkout there. The script mounts a fresh tmpfs only
    where GUEST_TMPFS says, and the runner refuses a checkout or kernel that one of them would hide."""
    text = vm.run_script("/k", "/r", "/r/.venv/bin/python", 0.05)
    fresh = {line.split()[-1] for part in text.splitlines() for line in part.split("&&")
             if line.split()[:3] == ["mount", "-t", "tmpfs"]}
    assert fresh <= set(vm.GUEST_TMPFS), fresh
    assert vm.hidden_in_guest(Path("/tmp/fc1/flowpulse")) is None
    assert vm.hidden_in_guest(Path("/root/.cache/flowpulse/guest/6.1.0-57-amd64")) is None
    assert vm.hidden_in_guest(Path("/run/ci/flowpulse")) == "/run"
    assert vm.hidden_in_guest(Path("/running/flowpulse")) is None
    assert "TMPDIR=/run/tmp" in text


@pytest.mark.skipif(not kernel.BUSYBOX.exists(), reason="busybox-static not installed (scripts/test.sh and scripts/guest-test.sh install it)")
def test_a_612_style_kernel_gets_its_modules_in_dependency_order(tmp_path):
    """Debian's 6.12: virtio built in, modules xz-packed, 9pnet needing netfs, no fscache module at all."""
    import lzma

    tree = kernel.KernelTree("6.12.107+deb12-amd64", tmp_path / "k")
    d = tree.modules / "kernel"
    d.mkdir(parents=True)
    for m in ("9pnet", "9pnet_virtio", "netfs", "9p", "overlay"):
        (d / f"{m}.ko.xz").write_bytes(lzma.compress(b"\x7fELF" + m.encode()))
    builtin = ["virtio_ring", "virtio", "virtio_pci_modern_dev", "virtio_pci_legacy_dev", "virtio_pci"]
    (tree.modules / "modules.builtin").write_text("".join(f"kernel/drivers/virtio/{m}.ko\n" for m in builtin))
    (tree.modules / "modules.dep").write_text(
        "kernel/9pnet.ko.xz: kernel/netfs.ko.xz\nkernel/9pnet_virtio.ko.xz: kernel/9pnet.ko.xz kernel/netfs.ko.xz\n"
        "kernel/netfs.ko.xz:\nkernel/9p.ko.xz: kernel/9pnet.ko.xz kernel/netfs.ko.xz\nkernel/overlay.ko.xz:\n")
    (tree.root / "boot").mkdir(parents=True)
    tree.vmlinuz.write_bytes(b"kernel")
    order = tree.load_order(kernel.INITRAMFS_MODULES)
    assert order.index("netfs") < order.index("9pnet") < order.index("9pnet_virtio") < order.index("9p")
    out = kernel.initramfs(tree, tmp_path / "initrd.gz")
    listing = subprocess.run(["cpio", "-t", "--quiet"], input=gzip.decompress(out.read_bytes()),
                             capture_output=True).stdout.decode().split()
    assert {f"mods/{m}.ko" for m in ("9pnet", "9pnet_virtio", "netfs", "9p", "overlay")} <= set(listing)
    assert not any(f"mods/{m}.ko" in listing for m in builtin + ["fscache"])
    (d / "9p.ko.xz").unlink()                 # a module the root needs, missing: named
    with pytest.raises(kernel.EnvironmentProblem, match="no module 9p.ko"):
        kernel.initramfs(tree, tmp_path / "initrd2.gz")


# linux-headers-<version>'s Depends, as Debian 12 ships them: 6.12's names the image (and, through it,
# udev and initramfs-tools), so installing those headers on the host installed a second kernel there
DEPENDS_612 = ("linux-base (>= 4.12~), linux-headers-6.12.107+deb12-common (= 6.12.107-1~deb12u1), "
               "linux-image-6.12.107+deb12-amd64 (= 6.12.107-1~deb12u1) | linux-image-6.12.107+deb12-amd64-unsigned "
               "(= 6.12.107-1~deb12u1), linux-kbuild-6.12.107+deb12, gcc-12")
DEPENDS_61 = "linux-headers-6.1.0-57-common (= 6.1.192-3), linux-kbuild-6.1 (>= 6.1.192-3), linux-compiler-gcc-12-x86"


def test_the_guest_takes_the_headers_common_part_and_kbuild_not_the_image():
    assert kernel.header_packages(DEPENDS_612) == ["linux-headers-6.12.107+deb12-common", "linux-kbuild-6.12.107+deb12"]
    assert kernel.header_packages(DEPENDS_61) == ["linux-headers-6.1.0-57-common", "linux-kbuild-6.1"]


def fake_deb(out: Path, name: str, files: dict[str, str], links: dict[str, str] | None = None,
             depends: str = "") -> Path:
    """A real .deb (dpkg-deb -b) holding ``files`` (path: text) and ``links`` (path: symlink target)."""
    root = out / f"{name}.d"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        f"Package: {name}\nVersion: 1\nArchitecture: all\nMaintainer: t <t@t>\nDescription: t\n"
        + (f"Depends: {depends}\n" if depends else ""))
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    for path, target in (links or {}).items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).symlink_to(target)
    deb = out / f"{name}_1_all.deb"
    subprocess.run(["dpkg-deb", "--root-owner-group", "-b", str(root), str(deb)], check=True, capture_output=True)
    return deb


def test_fetch_unpacks_the_image_and_its_headers_into_the_cache_and_installs_nothing(tmp_path, monkeypatch):
    v = "6.12.107+deb12-amd64"
    debs = {
        f"linux-image-{v}": fake_deb(tmp_path, f"linux-image-{v}", {f"boot/vmlinuz-{v}": "kernel",
                                                                    f"lib/modules/{v}/modules.builtin": ""}),
        f"linux-headers-{v}": fake_deb(
            tmp_path, f"linux-headers-{v}", {f"usr/src/linux-headers-{v}/Makefile": "include common\n"},
            links={f"lib/modules/{v}/build": f"/usr/src/linux-headers-{v}",
                   f"lib/modules/{v}/source": "/usr/src/linux-headers-6.12.107+deb12-common",
                   f"usr/src/linux-headers-{v}/scripts": "../../lib/linux-kbuild-6.12.107+deb12/scripts"},
            depends=DEPENDS_612),
        "linux-headers-6.12.107+deb12-common": fake_deb(
            tmp_path, "linux-headers-6.12.107+deb12-common",
            {"usr/src/linux-headers-6.12.107+deb12-common/include/linux/types.h": "/* types */\n"}),
        "linux-kbuild-6.12.107+deb12": fake_deb(
            tmp_path, "linux-kbuild-6.12.107+deb12", {"usr/lib/linux-kbuild-6.12.107+deb12/scripts/Kbuild.include": "#\n"},
            links={"usr/src/linux-kbuild-6.12.107+deb12": "../lib/linux-kbuild-6.12.107+deb12"}),
    }
    asked: list[list[str]] = []

    def download(pkgs, into):
        asked.append(list(pkgs))
        return [Path(shutil.copy2(debs[p], into)) for p in pkgs]

    ran: list[list[str]] = []
    real_run = subprocess.run

    def run(argv, *a, **kw):
        ran.append(list(argv))
        return real_run(argv, *a, **kw)

    monkeypatch.setattr(kernel, "_download", download)
    monkeypatch.setattr(kernel.subprocess, "run", run)
    cache = tmp_path / "cache"
    tree = kernel.fetch(v, cache, log=lambda m: None)
    assert asked == [[f"linux-image-{v}", f"linux-headers-{v}"],
                     ["linux-headers-6.12.107+deb12-common", "linux-kbuild-6.12.107+deb12"]]
    assert tree.complete() and (tree.modules / "modules.dep").exists()
    assert os.readlink(tree.modules / "build") == f"/usr/src/linux-headers-{v}" == "/" + str(tree.headers.relative_to(tree.root))
    assert (tree.root / "usr/src/linux-headers-6.12.107+deb12-common/include/linux/types.h").exists()
    # kbuild's relative links resolve inside the cache (the guest bind-mounts these directories over /usr)
    assert (tree.headers / "scripts" / "Kbuild.include").exists()
    # unpacked, never installed: nothing ran apt-get install or dpkg -i/--install
    assert not [a for a in ran if a[:2] == ["apt-get", "install"] or (a[0] == "dpkg" and {"-i", "--install"} & set(a))], ran
    assert sorted(p.name for p in cache.iterdir()) == [v]          # the download and staging directories are gone
    # a second fetch finds it whole; a cache from before the headers were unpacked here is fetched again
    kernel.fetch(v, cache, log=lambda m: None)
    assert len(asked) == 2
    shutil.rmtree(tree.root / "usr")
    kernel.fetch(v, cache, log=lambda m: None)
    assert len(asked) == 4 and tree.complete()


def test_a_headers_package_without_its_common_part_is_refused_in_one_line(tmp_path, monkeypatch):
    v = "6.1.0-57-amd64"
    debs = {f"linux-image-{v}": fake_deb(tmp_path, f"linux-image-{v}", {f"boot/vmlinuz-{v}": "kernel"}),
            f"linux-headers-{v}": fake_deb(tmp_path, f"linux-headers-{v}", {"x": ""}, depends="gcc-12")}
    monkeypatch.setattr(kernel, "_download", lambda pkgs, into: [Path(shutil.copy2(debs[p], into)) for p in pkgs])
    with pytest.raises(kernel.EnvironmentProblem, match=r"depends on no linux-headers-\*-common \(gcc-12\)"):
        kernel.fetch(v, tmp_path / "cache", log=lambda m: None)
    assert list((tmp_path / "cache").iterdir()) == []      # nothing half-fetched is left in the cache


def test_the_guest_mounts_the_caches_headers_over_usr_src_before_it_links_the_modules():
    text = vm.run_script("/k", "/r", "/r/.venv/bin/python", 0.05)
    loop = text.index("for d in /k/usr/src/* /k/usr/lib/linux-kbuild-*; do")
    assert 'mkdir -p "$t" && mount --bind "$d" "$t"' in text and '[ -e "$t" ] || ln -sfn "$(readlink "$d")" "$t"' in text
    assert loop < text.index("for f in /k/lib/modules/$V/*") < text.index("modprobe -a")


def test_the_guests_script_takes_a_cache_and_a_checkout_whose_paths_hold_spaces(tmp_path):
    """The cache (FLOWPULSE_GUEST_CACHE) and the checkout may live under any path: the script quotes them.
    Its two linking loops run here with mount, ln and mkdir replaced by functions that print their
    arguments (nothing on this machine is touched)."""
    kdir = tmp_path / "my cache" / "6.1.0-57-amd64"
    v = "6.1.0-57-amd64"
    (kdir / "usr/src/linux-headers-6.1.0-57-amd64").mkdir(parents=True)
    (kdir / "usr/lib/linux-kbuild-6.1").mkdir(parents=True)
    (kdir / f"lib/modules/{v}").mkdir(parents=True)
    (kdir / f"lib/modules/{v}/flowpulse-test.ko").write_text("")   # a name no host has
    text = vm.run_script(kdir, tmp_path / "a checkout", tmp_path / "a checkout/.venv/bin/python", 0.05)
    body = text[text.index("for d in "):text.index("modprobe -a")]
    fakes = 'mount() { echo "mount|$*"; }\nln() { echo "ln|$*"; }\nmkdir() { echo "mkdir|$*"; }\n'
    out = subprocess.run(["bash", "-c", fakes + f"V={v}\n" + body], capture_output=True, text=True, check=True)
    lines = out.stdout.splitlines()
    assert f"mount|--bind {kdir}/usr/src/linux-headers-{v} /usr/src/linux-headers-{v}" in lines
    assert f"mount|--bind {kdir}/usr/lib/linux-kbuild-6.1 /usr/lib/linux-kbuild-6.1" in lines
    assert f"ln|-s {kdir}/lib/modules/{v}/flowpulse-test.ko /lib/modules/{v}/flowpulse-test.ko" in lines, lines
    assert out.stderr == ""
    assert f"cd {shlex.quote(str(tmp_path / 'a checkout'))}\n" in text
    assert f"{shlex.quote(str(tmp_path / 'a checkout/.venv/bin/python'))} -m pytest" in text
    subprocess.run(["bash", "-n", "-c", text], check=True)


def fake_guest(monkeypatch, script: str) -> None:
    """vm.run with qemu replaced by ``sh -c script SHARE`` (the script writes what the guest would to the
    results share, $1) and no initramfs built."""
    monkeypatch.setattr(vm, "initramfs", lambda tree, out: out.write_bytes(b""))
    monkeypatch.setattr(vm, "qemu_argv", lambda tree, initrd, share, cpus, mem: ["sh", "-c", script, "sh", str(share)])
    monkeypatch.setattr(vm, "POLL_S", 0.05)
    if not (vm.REPO / ".venv" / "bin" / "python").exists():
        pytest.skip("no .venv in this checkout (scripts/setup.sh makes it)")


def test_a_running_guest_says_how_far_pytest_got_and_a_failure_at_once(tmp_path, monkeypatch):
    fake_guest(monkeypatch, 'printf "....s" > $1/pytest.log; sleep 0.4; printf "F" >> $1/pytest.log; sleep 0.4; '
                            'printf ".. [100%%]\\n1 failed, 6 passed, 1 skipped in 1.00s\\n" >> $1/pytest.log; '
                            'echo 1 > $1/rc')
    monkeypatch.setattr(vm, "PROGRESS_S", 0.2)
    said = []
    res = vm.run(fake_tree(tmp_path), ["tests/test_x.py"], timeout_s=60, keep=tmp_path / "kept", log=said.append)
    assert res.rc == 1 and res.summary == "1 failed, 6 passed, 1 skipped in 1.00s", res
    progress = [m for m in said if " tests done" in m]
    assert any(m.endswith("5 tests done: 4 passed, 1 skipped") for m in progress), said          # every PROGRESS_S
    assert any(m.endswith("6 tests done: 4 passed, 1 failed, 1 skipped") for m in progress), said   # at once
    assert (tmp_path / "kept" / "pytest.log").read_text().endswith("in 1.00s\n")


def test_a_stopped_guest_keeps_its_logs_so_far(tmp_path, monkeypatch):
    import signal
    import threading

    fake_guest(monkeypatch, 'printf "...F" > $1/pytest.log; echo "guest: 14.0x slower" > $1/guest.log; '
                            'echo "{}" > $1/report.jsonl; sleep 30')
    threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGTERM)).start()
    with pytest.raises(vm.Stopped):
        vm.run(fake_tree(tmp_path), ["tests/test_x.py"], timeout_s=60, keep=tmp_path / "kept", log=lambda m: None)
    assert (tmp_path / "kept" / "pytest.log").read_text() == "...F"
    assert (tmp_path / "kept" / "guest.log").read_text().startswith("guest: 14.0x")
    assert (tmp_path / "kept" / "report.jsonl").read_text() == "{}\n"


def test_a_stopped_matrix_stops_its_guest(tmp_path):
    """SIGTERM to the matrix reaches the guest runner it started (which kills its guest and keeps its logs):
    it was left running, qemu and all, after the matrix went."""
    import signal

    (tmp_path / "bench").mkdir()
    shutil.copy(REPO / "bench" / "kernel_matrix.py", tmp_path / "bench")
    (tmp_path / "scripts").mkdir()
    runner = tmp_path / "scripts" / "guest-test.sh"
    runner.write_text(f'#!/bin/sh\necho $$ > {tmp_path}/pid\ntrap "echo stopped > {tmp_path}/runner; exit 143" TERM\n'
                      f'echo started > {tmp_path}/runner\nwhile :; do sleep 0.1; done\n')
    runner.chmod(0o755)
    m = subprocess.Popen([sys.executable, str(tmp_path / "bench" / "kernel_matrix.py"), "--kernel", "6.1.0-57-amd64",
                          "--", "tests/test_x.py"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO)})     # the copy imports the project's modules
    try:
        end = time.monotonic() + 60
        while not (tmp_path / "runner").exists() and m.poll() is None and time.monotonic() < end:
            time.sleep(0.05)
        assert (tmp_path / "runner").exists(), (m.poll(), m.stderr.read() if m.poll() is not None else "still running")
        m.send_signal(signal.SIGTERM)
        assert m.wait(timeout=20) == 143
        end = time.monotonic() + 5
        while (tmp_path / "runner").read_text() != "stopped\n" and time.monotonic() < end:
            time.sleep(0.05)
        assert (tmp_path / "runner").read_text() == "stopped\n"
    finally:
        m.kill()
        if (tmp_path / "pid").exists():      # a runner the matrix left (the fault this test is for) goes too
            try:
                os.kill(int((tmp_path / "pid").read_text()), signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_stop_while_the_runner_starts_still_stops_it(tmp_path):
    """A SIGTERM that comes while the runner is being started (here: at once after its fork, before the matrix
    holds it) waits until the matrix does, then stops it: raised inside ``Popen`` it left the runner running."""
    import importlib.util
    import signal

    spec = importlib.util.spec_from_file_location("kernel_matrix", REPO / "bench" / "kernel_matrix.py")
    km = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(km)
    runner = tmp_path / "runner.sh"
    runner.write_text(f'#!/bin/sh\necho $$ > {tmp_path}/pid\ntrap "echo stopped > {tmp_path}/said; exit 143" TERM\n'
                      f'echo started > {tmp_path}/said\nwhile :; do sleep 0.1; done\n')
    runner.chmod(0o755)

    def popen_then_stop(*args, **kw):
        proc = subprocess.Popen(*args, **kw)
        end = time.monotonic() + 30
        while not (tmp_path / "said").exists() and time.monotonic() < end:
            time.sleep(0.02)             # the runner has set its trap
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)                  # the handler runs here, inside the start
        return proc

    before = signal.signal(signal.SIGTERM, km.stop)
    try:
        with pytest.raises(SystemExit) as stopped:
            km.guest([str(runner)], 60, "", popen=popen_then_stop)
        assert stopped.value.code == 143
        assert (tmp_path / "said").read_text() == "stopped\n"
    finally:
        signal.signal(signal.SIGTERM, before)
        try:
            os.kill(int((tmp_path / "pid").read_text()), signal.SIGKILL)
        except (ProcessLookupError, FileNotFoundError, ValueError):
            pass
