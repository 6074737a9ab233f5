"""A run directory: what an experiment writes there, how it is read back, and how a new run claims one.

An experiment writes ``spec.json``, ``alerts.jsonl``, ``incidents.jsonl``, ``pulses/pulses-<switch>.jsonl``
(``.gz`` accepted), ``workload/``, ``baselines.json``, ``report.json`` and the report's ``*.png``. The
JSON-lines files are appended to, so a second run into the same directory would mix with the first:
:func:`claim` refuses a directory that holds anything unless told to replace the run files.
"""
from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

from agent.pulse import PulseCounts
from netns_testbed import untrusted
from netns_testbed.errors import SpecError
from netns_testbed.safefiles import read_bounded
from netns_testbed.untrusted import BadInput

RUN_FILES = ("spec.json", "alerts.jsonl", "incidents.jsonl", "pulses", "workload", "baselines.json", "report.json")
RUN_GLOBS = ("*.png",)
REPORT_SCHEMA = Path(__file__).with_name("report.schema.json")


def load_report(run: Path, parts: tuple[str, ...] | None = None) -> dict:
    """A run directory's report.json, checked against :data:`REPORT_SCHEMA` before any of it is used: a
    missing, unreadable or malformed report is one SpecError line naming the problem. ``parts``: only these
    top-level parts are needed and checked (replay reads ``spec``, ``faults`` and ``iterations``: the
    recorded runs in tests/data ship no more)."""
    path = Path(run) / "report.json"
    if not path.exists():
        raise SpecError(f"{run} is not a run directory (no report.json): run `flowpulse experiment --out DIR` first")
    try:
        report = untrusted.loads(read_bounded(path, limit=256 << 20))
        untrusted.check(REPORT_SCHEMA, report) if parts is None else untrusted.check_parts(REPORT_SCHEMA, report, parts)
    except (OSError, BadInput) as e:
        raise SpecError(f"{path}: not a report this version reads ({getattr(e, 'strerror', None) or e}): "
                        f"run the experiment again") from None
    return report


def validate_report(report: dict) -> None:
    """Check report.json against its published schema (:data:`REPORT_SCHEMA`); BadInput if it does not hold."""
    untrusted.check(REPORT_SCHEMA, report)


def check_out(out: Path, force: bool) -> None:
    """Refuse an ``--out`` that is a file, or a directory holding anything (unless ``force``); writes
    nothing."""
    if out.exists() and not out.is_dir():
        raise SpecError(f"--out {out} is a file: name a directory for the run")
    if out.is_dir() and any(out.iterdir()):
        if not force:
            held = sorted(p.name for p in out.iterdir())
            raise SpecError(f"--out {out} is not empty ({', '.join(held[:3])}{', ...' if len(held) > 3 else ''}): "
                            "a new run would mix with what is there; name a new directory or add --force "
                            "to replace its run files")
        strays = [p.name for p in out.iterdir() if p.name not in RUN_FILES
                  and not any(p.match(g) for g in RUN_GLOBS)]
        if strays:
            raise SpecError(f"--out {out} holds files that are not a run's ({', '.join(sorted(strays)[:3])}): "
                            "--force replaces only run files; name a new directory")


def claim(out: Path, force: bool) -> None:
    """:func:`check_out`, then (with ``force``) remove the run files a previous run left."""
    check_out(out, force)
    if out.is_dir():
        for p in list(out.iterdir()):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()


def check_replayable(*runs: Path) -> None:
    """Refuse, before any is read, directories that do not each hold a finished run's ``report.json`` and
    ``pulses/`` (what a replay of the run reads): the first one that does not is named."""
    for run in runs:
        if not (run / "report.json").is_file() or not (run / "pulses").is_dir():
            raise SpecError(f"{run} is not a run directory (report.json and pulses/): give an experiment's --out")


def load_pulses(directory: Path) -> dict[str, list[PulseCounts]]:
    """Every switch's recorded pulses under ``directory`` (a run's ``pulses/``)."""
    out: dict[str, list[PulseCounts]] = {}
    if not directory.is_dir():
        return out
    for f in sorted([*directory.glob("pulses-*.jsonl"), *directory.glob("pulses-*.jsonl.gz")]):
        sw = f.name[len("pulses-"):].split(".")[0]
        text = gzip.decompress(f.read_bytes()).decode() if f.suffix == ".gz" else f.read_text()
        out[sw] = [PulseCounts.from_dict(json.loads(l)) for l in text.splitlines() if l.strip()]
    return out
