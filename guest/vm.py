"""Boot the guest, run tests in it, bring the results back.

The guest runs ``run.sh`` (:data:`RUN_SH`) from the writable results share after
``switch_root``: it mounts what a booted system has, links the unpacked
kernel's modules under ``/lib/modules`` and its headers over ``/usr/src`` (bind mounts of
the cache: the host needs none installed), loads the modules the testbed needs, runs pytest with the
arguments from ``pytest.args`` (one per line, never through a shell) and writes
``rc`` and ``pytest.log`` to the share before powering off. The host waits for
qemu with a deadline, kills it on timeout or on its own SIGTERM (qemu also dies
with its parent: ``PR_SET_PDEATHSIG``) and removes its working directory.
"""
from __future__ import annotations

import ctypes
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from guest.kernel import KernelTree, initramfs
from netns_testbed.errors import EnvironmentProblem
from netns_testbed.slowdown import cpu_seconds

REPO = Path(__file__).resolve().parent.parent
SHARE = "/flowpulse-guest"
# Mounted afresh (tmpfs) in the guest, hiding the host's files below them. Not /tmp: the overlay's upper
# layer is a tmpfs already, and checkouts live under /tmp (CI's clean clones); TMPDIR points pytest and
# tempfile at /run/tmp instead of the host's /tmp below the overlay.
GUEST_TMPFS = ("/run", "/dev/shm")
PROGRESS_S = 300.0      # how often a long run says how far pytest got (at once when a test fails)
POLL_S = 15.0           # how often the runner reads the guest's pytest log while it runs
_PROGRESS_LINE = re.compile(r"^([.FEsxX]+)\s*(?:\[\s*(\d+)%\])?\s*$")
GUEST_MODULES = ("veth", "sch_ingress", "cls_bpf", "act_mirred", "sch_netem", "nf_tables", "bridge")

RUN_SH = r"""#!/bin/bash
# flowpulse guest: runs after switch_root, from the results share
R=%(share)s
exec > $R/guest.log 2>&1
set -x
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /dev/pts /dev/shm && mount -t devpts devpts /dev/pts && mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /run && mkdir -p /run/tmp
mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null
mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
V=$(uname -r)
# the kernel's headers, unpacked beside its image, where its build and source links point (over the host's own
# copy if it has one: the guest reads only the cache's)
for d in %(kdir)s/usr/src/* %(kdir)s/usr/lib/linux-kbuild-*; do
    t=${d#%(kdir)s}
    if [ -L "$d" ]; then
        [ -e "$t" ] || ln -sfn "$(readlink "$d")" "$t"
    elif [ -d "$d" ]; then
        mkdir -p "$t" && mount --bind "$d" "$t"
    fi
done
mkdir -p /lib/modules/$V
for f in %(kdir)s/lib/modules/$V/*; do
    n=$(basename "$f")
    [ -e "/lib/modules/$V/$n" ] || ln -s "$f" "/lib/modules/$V/$n"
done
modprobe -a %(modules)s
ip link set lo up
hostname flowpulse-guest
export HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin PYTHONDONTWRITEBYTECODE=1 TMPDIR=/run/tmp
cd %(repo)s
mapfile -t args < $R/pytest.args
set +x
echo "guest: kernel $V, $(nproc) CPUs, sch_netem $(lsmod | grep -q '^sch_netem' && echo loaded || echo missing)"
# The guest's pace against the host's (the same loop; netns_testbed/slowdown.py): job deadlines, waits
# and per-test time limits stretch by it. Emulated, a job is slow, not hung.
export FLOWPULSE_SLOWDOWN=$(%(python)s -m netns_testbed.slowdown --against %(host_s).4f)
echo "guest: ${FLOWPULSE_SLOWDOWN}x slower than the host (FLOWPULSE_SLOWDOWN)"
start=$(date +%%s)
# report.jsonl: one JSON object a finished test phase, flushed as written (pytest-reportlog), so that a run
# stopped midway still says which tests ended and how (bench/kernel_matrix.py --resume records them)
%(python)s -m pytest -q -p no:cacheprovider --report-log=$R/report.jsonl "${args[@]}" > $R/pytest.log 2>&1
rc=$?
# the kernel's messages (the console shows only the critical ones): an OOM kill, a BPF verifier or
# netlink complaint; the processes the kernel killed are named in the run's log
dmesg > $R/dmesg.log 2>&1
grep -i 'killed process' $R/dmesg.log | sed 's/^/guest: kernel: /'
# a failed run's test directories (job and rank logs, recorded pulses) live in this tmpfs: keep them
[ $rc -ne 0 ] && [ -d /run/tmp/pytest-of-root ] && cp -a /run/tmp/pytest-of-root $R/pytest-tmp
echo $rc > $R/rc
echo "guest: pytest took $(( $(date +%%s) - start )) s"
sync
echo o > /proc/sysrq-trigger
sleep 10
"""


@dataclass(frozen=True)
class GuestResult:
    rc: int | None            # pytest's exit status (None: the guest never got that far)
    summary: str              # pytest's last line, or what went wrong
    seconds: float            # boot to power-off
    pytest_log: str
    guest_log: str
    console: str


class Stopped(Exception):
    """SIGTERM while the guest ran: qemu was killed, the logs so far kept (``keep``) and the working
    directory removed."""


def _on_term(signum, frame) -> None:
    raise Stopped()


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG


def qemu_argv(tree: KernelTree, initrd: Path, share: Path, cpus: int, mem_mb: int) -> list[str]:
    qemu = shutil.which("qemu-system-x86_64")
    if not qemu:
        raise EnvironmentProblem("qemu-system-x86_64 missing: apt-get install qemu-system-x86 (scripts/guest-test.sh does)")
    # TCG with -cpu max: a KVM guest hung at the firmware here, and the default CPU model lacks
    # instructions numpy and torch wheels use. tsc=reliable: under emulation the clocksource watchdog
    # (or the boot's TSC sync check) marks the TSC unstable at some point, and the kernel then flips the
    # sched_clock_stable static key by patching live code through int3; 6.12 guests died of that flip
    # under TCG ("Oops: int3" in sched_clock_cpu from __sched_clock_work, kernel panic), once in early
    # boot and once 26 minutes into a run. The emulated TSC follows the host's clock: it is reliable.
    return [qemu, "-cpu", "max", "-smp", str(cpus), "-m", str(mem_mb), "-nographic", "-no-reboot", "-nic", "none",
            "-kernel", str(tree.vmlinuz), "-initrd", str(initrd),
            "-append", "console=ttyS0 panic=-1 quiet loglevel=3 tsc=reliable",
            "-virtfs", "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap",
            "-virtfs", f"local,path={share},mount_tag=results,security_model=none"]


def run_script(kdir: Path | str, repo: Path | str, python: Path | str, host_s: float) -> str:
    """The guest's ``run.sh`` for a kernel tree, a checkout and its interpreter; ``host_s`` is the host's
    time for the slowdown loop (netns_testbed/slowdown.py), which the guest measures itself against."""
    q = lambda p: shlex.quote(str(p))   # noqa: E731 (a cache or checkout path may hold spaces)
    return RUN_SH % {"share": SHARE, "kdir": q(kdir), "modules": " ".join(GUEST_MODULES), "repo": q(repo),
                     "python": q(python), "host_s": host_s}


def hidden_in_guest(path: Path) -> str | None:
    """The guest's fresh mount that hides ``path`` of the host, if one does."""
    path = Path(os.path.realpath(path))
    return next((m for m in GUEST_TMPFS if path == Path(m) or Path(m) in path.parents), None)


def progress(pytest_log: str) -> tuple[dict[str, int], int | None]:
    """How far a running ``pytest -q`` got, from its log so far: its progress characters counted (passed,
    failed, errors, skipped; xfail/xpass as passed) and the last percentage it printed (None before one)."""
    n = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    pct = None
    for line in pytest_log.splitlines():
        m = _PROGRESS_LINE.match(line)
        if m is None:
            continue
        for ch in m.group(1):
            n["failed" if ch == "F" else "errors" if ch == "E" else "skipped" if ch == "s" else "passed"] += 1
        if m.group(2) is not None:
            pct = int(m.group(2))
    return n, pct


def progress_line(n: dict[str, int], pct: int | None, minutes: float) -> str:
    """``guest: 42 min: 130 tests done (71%): 127 passed, 1 failed, 2 skipped``"""
    return (f"guest: {minutes:.0f} min: {sum(n.values())} tests done{f' ({pct}%)' if pct is not None else ''}: "
            + ", ".join(f"{v} {k}" for k, v in n.items() if v))


def run(tree: KernelTree, pytest_args: list[str], cpus: int = 2, mem_mb: int = 3072, timeout_s: float = 1800.0,
        keep: Path | None = None, log=print) -> GuestResult:
    """Boot ``tree``'s kernel, run ``pytest <pytest_args>`` in the project's checkout as root, return what happened."""
    for what, path in (("the checkout", REPO), ("the guest kernel", tree.root)):
        where = hidden_in_guest(path)
        if where:
            raise EnvironmentProblem(f"{what} {path} is under {where}, which the guest mounts afresh: "
                                     "move it (or FLOWPULSE_GUEST_CACHE) elsewhere")
    work = Path(tempfile.mkdtemp(prefix="flowpulse-guest-"))
    share = work / "share"
    share.mkdir()
    try:
        initrd = initramfs(tree, work / "initrd.gz")
        (share / "pytest.args").write_text("".join(a + "\n" for a in pytest_args))
        py = REPO / ".venv" / "bin" / "python"
        if not py.exists():
            raise EnvironmentProblem(f"{py} missing: run scripts/setup.sh first")
        run_sh = share / "run.sh"
        run_sh.write_text(run_script(tree.root, REPO, py, cpu_seconds()))
        run_sh.chmod(0o755)
        argv = qemu_argv(tree, initrd, share, cpus, mem_mb)
        log(f"guest: booting {tree.version} ({cpus} CPUs, {mem_mb} MiB, emulated), pytest {' '.join(pytest_args)}")
        start = time.monotonic()
        with open(work / "console.log", "wb") as console:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT,
                                    preexec_fn=_die_with_parent)
            old = signal.signal(signal.SIGTERM, _on_term)
            said, bad, last_said = 0, 0, start
            try:
                while proc.poll() is None and time.monotonic() - start < timeout_s:
                    try:
                        proc.wait(timeout=min(POLL_S, max(0.1, timeout_s - (time.monotonic() - start))))
                    except subprocess.TimeoutExpired:
                        pass
                    log_now = share / "pytest.log"
                    if proc.poll() is not None or not log_now.exists():
                        continue
                    n, pct = progress(log_now.read_text(errors="replace"))
                    now, done, failing = time.monotonic(), sum(n.values()), n["failed"] + n["errors"]
                    if failing > bad or (now - last_said >= PROGRESS_S and done > said):
                        log(progress_line(n, pct, (now - start) / 60))
                        said, bad, last_said = done, failing, now
            finally:
                signal.signal(signal.SIGTERM, old)
                if proc.poll() is None:      # timed out, SIGTERM or Ctrl-C: the guest goes with us
                    proc.kill()
                    proc.wait()
        took = time.monotonic() - start
        read = lambda p: p.read_text(errors="replace") if p.exists() else ""   # noqa: E731
        rc_text = read(share / "rc").strip()
        pytest_log, guest_log, console_text = read(share / "pytest.log"), read(share / "guest.log"), read(work / "console.log")
        if rc_text.isdigit():
            lines = [l for l in pytest_log.splitlines() if l.strip()]
            summary = lines[-1] if lines else "(pytest printed nothing)"
            rc = int(rc_text)
        elif took >= timeout_s:
            rc, summary = None, f"the guest did not finish in {timeout_s:.0f} s"
        else:
            rc, summary = None, "the guest stopped before pytest ended: " + \
                ((guest_log or console_text).strip().splitlines() or ["no output"])[-1]
        return GuestResult(rc, summary, took, pytest_log, guest_log, console_text)
    finally:
        if keep is not None:         # also when stopped: an hour's run leaves what it had got to
            keep_logs(work, keep)
        shutil.rmtree(work, ignore_errors=True)


def keep_logs(work: Path, keep: Path) -> None:
    """Copy a guest's logs (pytest's and its report log, the guest's, its console and kernel messages) and a
    failed run's test directories from its working directory ``work`` to ``keep``."""
    share = work / "share"
    keep.mkdir(parents=True, exist_ok=True)
    for name, src in (("pytest.log", share / "pytest.log"), ("report.jsonl", share / "report.jsonl"),
                      ("guest.log", share / "guest.log"), ("console.log", work / "console.log"),
                      ("dmesg.log", share / "dmesg.log")):
        (keep / name).write_text(src.read_text(errors="replace") if src.exists() else "")
    if (share / "pytest-tmp").is_dir():      # a failed run's test directories (run.sh copied them)
        shutil.rmtree(keep / "pytest-tmp", ignore_errors=True)
        shutil.copytree(share / "pytest-tmp", keep / "pytest-tmp", symlinks=True)
