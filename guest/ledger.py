"""What the kernel matrix has run, kept across runs: each test's outcome per kernel and per version of
the code, so that a selection too long for one sitting can be run in several and still be read as one
table (``bench/kernel_matrix.py --resume DIR``).

A :class:`Record` is one test (its pytest node id) on one kernel: the outcome (passed, failed, skipped,
error), its seconds (setup, call and teardown), when it ran, the commit, and the *code digest*: a hash of
every tracked file that the tests run (:func:`counts_for_code`: everything but the docs, the top-level
Markdown, ``mkdocs.yml`` and ``bench/``'s scripts). A record counts for the table only at the digest the
checkout has now: a change to the code makes every earlier record history, a change to the docs does not.
The digest is of the commit, so a checkout with uncommitted code changes is refused (:func:`code_digest`).

Outcomes come from pytest's report log (``--report-log``, the pytest-reportlog plugin: one JSON object a
test phase, flushed as it is written), so a run stopped midway keeps every test it finished; a test cut
off in the middle has no teardown report and is run again next time.
"""
from __future__ import annotations

import hashlib
import json
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from netns_testbed.errors import EnvironmentProblem, SpecError

OUTCOMES = ("passed", "failed", "skipped", "error")
NOT_CODE_DIRS = ("docs/",)
NOT_CODE_FILES = ("mkdocs.yml",)


def counts_for_code(path: str) -> bool:
    """Whether a tracked file is part of what the tests run (its change invalidates earlier records)."""
    if path.startswith(NOT_CODE_DIRS) or path in NOT_CODE_FILES:
        return False
    if "/" not in path and path.endswith(".md"):
        return False
    return not (path.startswith("bench/") and path.endswith(".py"))   # bench/data/ is read by tests


def _git(repo: Path, *args: str) -> str:
    try:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout
    except FileNotFoundError as e:
        raise EnvironmentProblem("git missing: apt-get install git (the matrix's records name commits)") from e
    except subprocess.CalledProcessError as e:
        raise EnvironmentProblem(f"{repo} is not a git checkout ({e.stderr.strip() or 'git failed'}): "
                                 "--resume records what a commit's code did, so run it in a clone") from e


def code_digest(repo: Path) -> tuple[str, str]:
    """``(digest, commit)`` of the checkout's HEAD. Refuses (SpecError) a checkout whose code differs from
    its HEAD: its records would name code that no commit holds."""
    dirty = [line[3:] for line in _git(repo, "status", "--porcelain", "--untracked-files=no").splitlines()
             if counts_for_code(line[3:].split(" -> ")[-1].strip('"'))]
    if dirty:
        raise SpecError(f"uncommitted changes to {', '.join(dirty[:3])}{' ...' if len(dirty) > 3 else ''}: "
                        "commit them (the records name the commit they ran) or run without --resume")
    commit = _git(repo, "rev-parse", "HEAD").strip()
    h = hashlib.sha256()
    for line in _git(repo, "ls-tree", "-r", "--full-tree", "HEAD").splitlines():
        meta, path = line.split("\t", 1)
        if counts_for_code(path):
            h.update(f"{meta}\t{path}\n".encode())
    return h.hexdigest()[:16], commit


@dataclass(frozen=True)
class Record:
    kernel: str
    test: str          # pytest node id
    outcome: str       # one of OUTCOMES
    seconds: float     # setup + call + teardown
    digest: str
    commit: str
    run: str           # which guest run (kernel and start time)
    at: float          # when it was recorded (epoch seconds)

    @classmethod
    def from_json(cls, d: object) -> "Record":
        if not isinstance(d, dict) or set(d) != {f for f in cls.__dataclass_fields__}:
            raise ValueError("not a record")
        for f in ("kernel", "test", "outcome", "digest", "commit", "run"):
            if not isinstance(d[f], str):
                raise ValueError(f"{f} is not text")
        if d["outcome"] not in OUTCOMES or not all(isinstance(d[f], (int, float)) and not isinstance(d[f], bool)
                                                  for f in ("seconds", "at")):
            raise ValueError("bad outcome or time")
        return cls(**d)


@dataclass(frozen=True)
class Run:
    """One guest run: what it was given and how it ended."""
    kernel: str
    run: str
    digest: str
    commit: str
    tests: int         # how many it was given
    recorded: int      # how many it finished (records written)
    rc: int | None
    minutes: float     # set-up, boot and pytest


def outcomes(report_log: str) -> dict[str, tuple[str, float]]:
    """Each finished test's ``(outcome, seconds)`` from a pytest report log. A test counts as finished when
    its teardown was reported; its outcome is ``error`` if setup or teardown failed, else its call's (or a
    skip at setup). Lines that are not JSON (a log cut off by a kill) are passed over."""
    phases: dict[str, dict[str, dict]] = {}
    for line in report_log.splitlines():
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if not isinstance(d, dict) or d.get("$report_type") != "TestReport":
            continue
        node, when = d.get("nodeid"), d.get("when")
        if isinstance(node, str) and when in ("setup", "call", "teardown"):
            phases.setdefault(node, {})[when] = d
    out: dict[str, tuple[str, float]] = {}
    for node, p in phases.items():
        if "teardown" not in p:
            continue
        seconds = sum(float(x.get("duration") or 0.0) for x in p.values())
        setup, call, teardown = p.get("setup", {}), p.get("call"), p["teardown"]
        if setup.get("outcome") == "failed" or teardown.get("outcome") == "failed":
            outcome = "error"
        elif call is None:
            outcome = "skipped" if setup.get("outcome") == "skipped" else "error"
        else:
            outcome = call.get("outcome") if call.get("outcome") in ("passed", "failed", "skipped") else "error"
        out[node] = (outcome, round(seconds, 2))
    return out


class Ledger:
    """``DIR/records.jsonl`` (one :class:`Record` a line) and ``DIR/runs.jsonl`` (one :class:`Run` a line),
    appended to, never rewritten."""

    def __init__(self, directory: Path):
        self.dir = directory
        self.records_path = directory / "records.jsonl"
        self.runs_path = directory / "runs.jsonl"
        self.unreadable = 0      # lines of records.jsonl that were not a record (said by the caller)

    @staticmethod
    def check(directory: Path) -> None:
        """Refuse (SpecError) a path that cannot hold the records, before anything runs."""
        if directory.exists() and not directory.is_dir():
            raise SpecError(f"--resume {directory} is not a directory: give a new or existing directory")
        for name in ("records.jsonl", "runs.jsonl"):
            if (directory / name).exists() and not (directory / name).is_file():
                raise SpecError(f"{directory / name} is not a file: give --resume a directory of the matrix's records")

    def records(self) -> list[Record]:
        out: list[Record] = []
        self.unreadable = 0
        if not self.records_path.exists():
            return out
        for line in self.records_path.read_text(errors="replace").splitlines():
            try:
                out.append(Record.from_json(json.loads(line)))
            except (ValueError, TypeError):
                self.unreadable += 1
        return out

    def runs(self) -> list[Run]:
        out: list[Run] = []
        if self.runs_path.exists():
            for line in self.runs_path.read_text(errors="replace").splitlines():
                try:
                    out.append(Run(**json.loads(line)))
                except (ValueError, TypeError):
                    continue
        return out

    def add(self, recs: list[Record], run: Run) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.records_path, "a") as f:
            f.writelines(json.dumps(asdict(r)) + "\n" for r in recs)
        with open(self.runs_path, "a") as f:
            f.write(json.dumps(asdict(run)) + "\n")

    def current(self, kernel: str, digest: str) -> dict[str, Record]:
        """Each test's latest record on ``kernel`` at ``digest``."""
        out: dict[str, Record] = {}
        for r in self.records():
            if r.kernel == kernel and r.digest == digest:
                out[r.test] = r
        return out

    def failed_then_passed(self, kernel: str, digest: str) -> list[str]:
        """Tests whose latest record at ``digest`` passed after an earlier one there failed (the table
        counts them as passed and names them: a pass that needed a second try)."""
        seen_bad: set[str] = set()
        out: list[str] = []
        for r in self.records():
            if r.kernel != kernel or r.digest != digest:
                continue
            if r.outcome in ("failed", "error"):
                seen_bad.add(r.test)
            elif r.outcome == "passed" and r.test in seen_bad and r.test not in out:
                out.append(r.test)
        latest = self.current(kernel, digest)
        return [t for t in out if latest[t].outcome == "passed"]


def todo(selection: list[str], done: dict[str, Record]) -> list[str]:
    """The tests of ``selection`` (node ids, in order) still to run: those with no record at this digest,
    or whose latest one failed or erred."""
    return [t for t in selection if t not in done or done[t].outcome in ("failed", "error")]


def new_records(kernel: str, report_log: str, digest: str, commit: str, run: str, given: list[str]) -> list[Record]:
    """Records for the tests of ``given`` that a guest run's report log shows finished."""
    now = time.time()
    got = outcomes(report_log)
    return [Record(kernel, t, got[t][0], got[t][1], digest, commit, run, now) for t in given if t in got]
