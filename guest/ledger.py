"""What the kernel matrix has run, kept across runs: each test's outcome per kernel and per commit, so
that a selection too long for one sitting can be run in several and still be read as one table
(``bench/kernel_matrix.py --resume DIR``).

A :class:`Record` is one test (its pytest node id) on one kernel: the outcome (passed, failed, skipped,
error), its seconds (setup, call and teardown), when it ran and the commit it ran. A record counts for
the table while nothing the selection runs has changed between its commit and the checkout's HEAD
(:func:`valid_commits`): :func:`counts_for_code` says which files those are (everything but the docs, the
top-level Markdown, ``mkdocs.yml``, ``bench/``'s scripts, this module, and test files outside the
selection). A commit that changes the code makes every earlier record history; a commit to the docs, the
matrix itself or another test file does not. A checkout whose code differs from its HEAD is refused
(:func:`head`): its records would name code that no commit holds.

Outcomes come from pytest's report log (``--report-log``, the pytest-reportlog plugin: one JSON object a
test phase, flushed as it is written), so a run stopped midway keeps every test it finished; a test cut
off in the middle has no teardown report and is run again next time.
"""
from __future__ import annotations

import json
import re
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from netns_testbed.errors import EnvironmentProblem, SpecError

OUTCOMES = ("passed", "failed", "skipped", "error")
COMMIT = re.compile(r"[0-9a-f]{7,40}")    # what a record may name: never an option for git
NOT_CODE_DIRS = ("docs/",)
NOT_CODE_FILES = ("mkdocs.yml", "guest/ledger.py")     # this module: the matrix's bookkeeping, run on the host


def counts_for_code(path: str, selection: frozenset[str] = frozenset()) -> bool:
    """Whether a tracked file is part of what the tests of ``selection`` (test files) run: a change to it
    makes earlier records history. Other test files do not count; shared test code (conftest, helpers,
    tests/data) does."""
    if path.startswith(NOT_CODE_DIRS) or path in NOT_CODE_FILES:
        return False
    if "/" not in path and path.endswith(".md"):
        return False
    if path.startswith("tests/") and path.rsplit("/", 1)[-1].startswith("test_") and path.endswith(".py"):
        return path in selection
    return not (path.startswith("bench/") and path.endswith(".py"))   # bench/data/ is read by tests


def _git(repo: Path, *args: str) -> str:
    try:
        return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout
    except FileNotFoundError as e:
        raise EnvironmentProblem("git missing: apt-get install git (the matrix's records name commits)") from e
    except subprocess.CalledProcessError as e:
        raise EnvironmentProblem(f"{repo} is not a git checkout ({e.stderr.strip() or 'git failed'}): "
                                 "--resume records what a commit's code did, so run it in a clone") from e


def head(repo: Path, selection: frozenset[str]) -> str:
    """The checkout's HEAD commit. Refuses (SpecError) a checkout whose code (for ``selection``) differs
    from it: its records would name code that no commit holds."""
    dirty = [line[3:] for line in _git(repo, "status", "--porcelain", "--untracked-files=no").splitlines()
             if counts_for_code(line[3:].split(" -> ")[-1].strip('"'), selection)]
    if dirty:
        raise SpecError(f"uncommitted changes to {', '.join(dirty[:3])}{' ...' if len(dirty) > 3 else ''}: "
                        "commit them (the records name the commit they ran) or run without --resume")
    return _git(repo, "rev-parse", "HEAD").strip()


def valid_commits(repo: Path, commits: set[str], selection: frozenset[str]) -> set[str]:
    """Those of ``commits`` between which and HEAD no file the selection runs changed (a commit git does
    not know, as after a rebase, is not valid)."""
    out = set()
    for c in commits:
        if not COMMIT.fullmatch(c):
            continue
        try:
            changed = _git(repo, "diff", "--name-only", "--no-renames", c, "HEAD", "--").splitlines()
        except EnvironmentProblem:
            continue
        if not any(counts_for_code(p, selection) for p in changed):
            out.add(c)
    return out


def test_files(node_ids: list[str]) -> frozenset[str]:
    """The files of a list of pytest node ids."""
    return frozenset(n.split("::", 1)[0] for n in node_ids)


@dataclass(frozen=True)
class Record:
    kernel: str
    test: str          # pytest node id
    outcome: str       # one of OUTCOMES
    seconds: float     # setup + call + teardown
    commit: str
    run: str           # which guest run (kernel and start time)
    at: float          # when it was recorded (epoch seconds)

    @classmethod
    def from_json(cls, d: object) -> "Record":
        if not isinstance(d, dict) or not set(cls.__dataclass_fields__) <= set(d):
            raise ValueError("not a record")
        d = {f: d[f] for f in cls.__dataclass_fields__}     # fields it does not know (the first records' digest)
        _check(d, ("kernel", "test", "outcome", "commit", "run"), ("seconds", "at"))
        if d["outcome"] not in OUTCOMES:
            raise ValueError("bad outcome")
        return cls(**d)


@dataclass(frozen=True)
class Run:
    """One guest run: what it was given and how it ended."""
    kernel: str
    run: str
    commit: str
    tests: int         # how many it was given
    recorded: int      # how many it finished (records written)
    rc: int | None
    minutes: float     # set-up, boot and pytest

    @classmethod
    def from_json(cls, d: object) -> "Run":
        if not isinstance(d, dict) or not set(cls.__dataclass_fields__) <= set(d):
            raise ValueError("not a run")
        d = {f: d[f] for f in cls.__dataclass_fields__}
        _check(d, ("kernel", "run", "commit"), ("tests", "recorded", "minutes"))
        if d["rc"] is not None and (not isinstance(d["rc"], int) or isinstance(d["rc"], bool)):
            raise ValueError("bad rc")
        return cls(**d)


def _check(d: dict, texts: tuple[str, ...], numbers: tuple[str, ...]) -> None:
    """A record's or run's fields: text where text belongs, finite numbers where numbers do, a commit that
    is hex (it reaches git's command line)."""
    if not all(isinstance(d[f], str) for f in texts):
        raise ValueError("a field is not text")
    if not all(isinstance(d[f], (int, float)) and not isinstance(d[f], bool) and d[f] == d[f]
               and abs(d[f]) != float("inf") for f in numbers):
        raise ValueError("a field is not a number")
    if not COMMIT.fullmatch(d["commit"]):
        raise ValueError("the commit is not a commit id")


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
        self._records: list[Record] | None = None     # read once, again after add()

    @staticmethod
    def check(directory: Path) -> None:
        """Refuse (SpecError) a path that cannot hold the records, before anything runs."""
        if directory.exists() and not directory.is_dir():
            raise SpecError(f"--resume {directory} is not a directory: give a new or existing directory")
        for name in ("records.jsonl", "runs.jsonl"):
            if (directory / name).exists() and not (directory / name).is_file():
                raise SpecError(f"{directory / name} is not a file: give --resume a directory of the matrix's records")

    def records(self) -> list[Record]:
        if self._records is not None:
            return self._records
        out: list[Record] = []
        self.unreadable = 0
        if self.records_path.exists():
            for line in self.records_path.read_text(errors="replace").splitlines():
                try:
                    out.append(Record.from_json(json.loads(line)))
                except (ValueError, TypeError):
                    self.unreadable += 1
        self._records = out
        return out

    def runs(self) -> list[Run]:
        out: list[Run] = []
        if self.runs_path.exists():
            for line in self.runs_path.read_text(errors="replace").splitlines():
                try:
                    out.append(Run.from_json(json.loads(line)))
                except (ValueError, TypeError):
                    continue
        return out

    def add(self, recs: list[Record], run: Run) -> None:
        self._records = None
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(self.records_path, "a") as f:
            f.writelines(json.dumps(asdict(r)) + "\n" for r in recs)
        with open(self.runs_path, "a") as f:
            f.write(json.dumps(asdict(run)) + "\n")

    def valid(self, repo: Path, selection: frozenset[str]) -> set[str]:
        """The commits of the records and runs whose code, for ``selection``, is HEAD's."""
        return valid_commits(repo, {r.commit for r in self.records()} | {r.commit for r in self.runs()}, selection)

    def current(self, kernel: str, valid: set[str]) -> dict[str, Record]:
        """Each test's latest record on ``kernel`` from a commit of ``valid``."""
        out: dict[str, Record] = {}
        for r in self.records():
            if r.kernel == kernel and r.commit in valid:
                out[r.test] = r
        return out

    def failed_then_passed(self, kernel: str, valid: set[str]) -> list[str]:
        """Tests whose latest valid record passed after an earlier valid one failed (the table counts them
        as passed and names them: a pass that needed a second try)."""
        seen_bad: set[str] = set()
        out: list[str] = []
        for r in self.records():
            if r.kernel != kernel or r.commit not in valid:
                continue
            if r.outcome in ("failed", "error"):
                seen_bad.add(r.test)
            elif r.outcome == "passed" and r.test in seen_bad and r.test not in out:
                out.append(r.test)
        latest = self.current(kernel, valid)
        return [t for t in out if latest[t].outcome == "passed"]


def todo(selection: list[str], done: dict[str, Record]) -> list[str]:
    """The tests of ``selection`` (node ids, in order) still to run: those with no valid record, or whose
    latest one failed or erred."""
    return [t for t in selection if t not in done or done[t].outcome in ("failed", "error")]


def new_records(kernel: str, report_log: str, commit: str, run: str, given: list[str]) -> list[Record]:
    """Records for the tests of ``given`` that a guest run's report log shows finished."""
    now = time.time()
    got = outcomes(report_log)
    return [Record(kernel, t, got[t][0], got[t][1], commit, run, now) for t in given if t in got]
