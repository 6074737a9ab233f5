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
                            "import agent.site, netns_testbed.datapath as d, sys;"
                            "print(agent.site.SCHEMA_PATH.is_file(), all((d.BPF_DIR / f).is_file() for f in "
                            "('switch.c', 'count.c', 'switch.h', 'packet.h')), str(d.BPF_DIR).startswith(sys.prefix))"],
                           capture_output=True, text=True, cwd=tmp_path)
    assert probe.stdout.split() == ["True", "True", "True"], probe.stdout + probe.stderr
