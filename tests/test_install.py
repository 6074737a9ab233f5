"""`pip install <checkout>` into a fresh venv outside the repository gives a working flowpulse (no root)."""
from __future__ import annotations

import json
import shutil
import subprocess
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RUN = REPO / "tests" / "data" / "recorded-runs" / "busy-ddp-two-faults"


def test_pip_install_into_a_fresh_venv_gives_a_working_cli(tmp_path):
    src = tmp_path / "src"   # a copy, so the build leaves nothing in the checkout
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(".git", ".venv", "tests", "build", "*.egg-info",
                                                             "__pycache__", ".pytest_cache"))
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    pip = subprocess.run([str(env_dir / "bin" / "pip"), "install", "-q", "--disable-pip-version-check", str(src)],
                         capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, pip.stderr[-2000:]
    exe = env_dir / "bin" / "flowpulse"
    out = subprocess.run([str(exe), "--help"], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0 and "fabric" in out.stdout and "agent" in out.stdout, out.stderr
    rep = subprocess.run([str(exe), "replay", str(RUN), "--json"], capture_output=True, text=True, cwd=tmp_path)
    assert rep.returncode == 0, rep.stderr[-2000:]
    det = json.loads(rep.stdout)["detection"]
    assert det["faults"] == 2 and det["localization_correct"] == 2 and det["false_positives"] == 0, det
    # package data: the C sources and the schemas came along
    probe = subprocess.run([str(env_dir / "bin" / "python"), "-c",
                            "import agent.site, agent.incidents as i, agent.detector.persistence as s, analysis.spec as e, "
                            "analysis.rundir as r, netns_testbed.datapath as d, sys;"
                            "print(all(p.is_file() for p in (agent.site.SCHEMA_PATH, i.VERDICT_SCHEMA, s.STATE_SCHEMA, "
                            "e.SCHEMA, r.REPORT_SCHEMA)), all((d.BPF_DIR / f).is_file() for f in "
                            "('switch.c', 'count.c', 'switch.h', 'packet.h')), str(d.BPF_DIR).startswith(sys.prefix))"],
                           capture_output=True, text=True, cwd=tmp_path)
    assert probe.stdout.split() == ["True", "True", "True"], probe.stdout + probe.stderr


def test_the_unit_is_hardened():
    """The shipped systemd unit, as `systemd-analyze security --offline=yes` rates it: exposure at most 2.0
    (0 is a unit that can do nothing, 10 one that can do anything), and the settings the agent relies on."""
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze missing (Debian: systemd)"
    unit = REPO / "deploy" / "systemd" / "flowpulse-agent.service"
    r = subprocess.run([analyze, "security", "--offline=yes", "--no-pager", str(unit)], capture_output=True, text=True)
    line = next((l for l in r.stdout.splitlines() if "Overall exposure level" in l), None)
    assert line, r.stdout + r.stderr
    exposure = float(line.split(":")[1].split()[0])
    assert exposure <= 2.0, r.stdout
    text = unit.read_text()
    for setting in ("UMask=0077", "ReadWritePaths=/var/lib/flowpulse /var/log/flowpulse", "ProtectKernelTunables=yes",
                    "ProtectKernelLogs=yes", "ProtectProc=invisible", "SystemCallFilter=@system-service bpf"):
        assert setting in text, setting
