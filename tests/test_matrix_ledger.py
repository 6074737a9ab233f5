"""The kernel matrix's records (guest/ledger.py) and its --resume runs, with a stand-in guest runner: a
selection run over several sittings is counted as one table, a stopped run keeps what it finished, and
a change to the code the selection runs (not to the docs or another test file) starts afresh."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from guest import ledger
from netns_testbed.errors import SpecError

REPO = Path(__file__).resolve().parent.parent

SAMPLE = '''
import pytest

@pytest.fixture
def bad_teardown():
    yield
    raise RuntimeError("teardown")

@pytest.fixture
def bad_setup():
    raise RuntimeError("setup")

def test_ok():
    pass

def test_fails():
    assert 1 == 2

def test_skips():
    pytest.skip("no tcx")

@pytest.mark.skipif(True, reason="at setup")
def test_skipped_at_setup():
    pass

def test_setup_errs(bad_setup):
    pass

def test_teardown_errs(bad_teardown):
    pass

@pytest.mark.xfail(reason="known")
def test_xfails():
    assert 0

@pytest.mark.parametrize("n", [1, 2])
def test_param(n):
    pass
'''


def real_report_log(tmp_path: Path) -> str:
    """A report log written by pytest itself (the plugin the guest uses) for tests of every outcome."""
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    log = tmp_path / "report.jsonl"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--report-log={log}",
                    "test_sample.py"], cwd=tmp_path, capture_output=True, text=True)
    return log.read_text()


def test_each_finished_test_s_outcome_is_read_from_pytest_s_report_log(tmp_path):
    got = ledger.outcomes(real_report_log(tmp_path))
    assert {k.split("::")[1]: v[0] for k, v in got.items()} == {
        "test_ok": "passed", "test_fails": "failed", "test_skips": "skipped", "test_skipped_at_setup": "skipped",
        "test_setup_errs": "error", "test_teardown_errs": "error", "test_xfails": "skipped",
        "test_param[1]": "passed", "test_param[2]": "passed"}
    assert all(s >= 0 for _, s in got.values())


def test_a_test_cut_off_before_its_teardown_is_not_finished(tmp_path):
    """A run stopped in the middle of a test: the report log ends at its setup (or mid-line): that test
    is run again next time, the ones before it are recorded."""
    lines = real_report_log(tmp_path).splitlines()
    cut = next(i for i, l in enumerate(lines) if '"test_sample.py::test_fails"' in l and '"when": "call"' in l)
    got = ledger.outcomes("\n".join(lines[:cut]) + '\n{"nodeid": "test_sample.py::test_fai')
    assert list(got) == ["test_sample.py::test_ok"]


SEL = frozenset({"tests/test_fabric.py"})


@pytest.mark.parametrize("path,code", [("agent/detector.py", True), ("tests/test_fabric.py", True),
                                       ("tests/test_docs.py", False), ("tests/conftest.py", True),
                                       ("tests/traffic.py", True), ("tests/data/pulse-traces/a.json", True),
                                       ("bench/data/x.csv", True), ("netns_testbed/bpf/count.bpf.c", True),
                                       ("requirements.txt", True), ("docs/guides/guest-kernels.md", False),
                                       ("README.md", False), ("mkdocs.yml", False), ("bench/kernel_matrix.py", False),
                                       ("guest/ledger.py", False), ("guest/vm.py", True), ("agent/README.md", True)])
def test_what_counts_as_code(path, code):
    assert ledger.counts_for_code(path, SEL) is code


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          capture_output=True, text=True, check=True).stdout


def a_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    for d in ("docs", "agent", "tests"):
        (repo / d).mkdir(parents=True, exist_ok=True)
    (repo / "agent" / "x.py").write_text("A = 1\n")
    (repo / "docs" / "x.md").write_text("doc\n")
    (repo / "tests" / "test_fabric.py").write_text("")
    (repo / "tests" / "test_docs.py").write_text("")
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "one")
    return repo


def test_a_record_holds_until_the_code_its_selection_runs_changes(tmp_path):
    repo = a_repo(tmp_path)
    c1 = ledger.head(repo, SEL)
    (repo / "docs" / "x.md").write_text("doc, edited\n")
    (repo / "tests" / "test_docs.py").write_text("X = 1\n")
    assert ledger.head(repo, SEL) == c1                       # uncommitted docs, another test file: allowed
    git(repo, "commit", "-qam", "docs and another test")
    assert ledger.valid_commits(repo, {c1}, SEL) == {c1}      # still holds
    assert ledger.valid_commits(repo, {c1}, SEL | {"tests/test_docs.py"}) == set()   # not for a selection with it
    (repo / "agent" / "x.py").write_text("A = 2\n")
    with pytest.raises(SpecError, match="uncommitted changes to agent/x.py"):
        ledger.head(repo, SEL)
    git(repo, "commit", "-qam", "code")
    c3 = ledger.head(repo, SEL)
    assert ledger.valid_commits(repo, {c1, c3, "f" * 40}, SEL) == {c3}   # the code changed; a commit git lacks


def rec(test: str, outcome: str, commit: str = "c1c1c1c1", run: str = "r1", kernel: str = "6.1.0-57-amd64") -> ledger.Record:
    return ledger.Record(kernel, test, outcome, 1.0, commit, run, time.time())


def test_the_records_read_back_keep_the_latest_per_test_and_pass_over_what_is_not_a_record(tmp_path):
    book = ledger.Ledger(tmp_path / "m")
    book.add([rec("t::a", "passed"), rec("t::b", "failed"), rec("t::c", "skipped")],
             ledger.Run("6.1.0-57-amd64", "r1", "c1c1c1c1", 4, 3, 1, 10.0))
    with open(book.records_path, "a") as f:
        f.write('{"kernel": "6.1.0-57-amd64", "test": "t::d", "outcome": "passed"}\nnot json\n'
                + json.dumps({**rec("t::e", "won").__dict__}) + "\n"
                + json.dumps({**rec("t::f", "passed").__dict__, "digest": "ce8ab5a9e368f129"}) + "\n")
    book.add([rec("t::b", "passed", run="r2"), rec("t::a", "failed", commit="c0c0c0c0")],
             ledger.Run("6.1.0-57-amd64", "r2", "c1c1c1c1", 1, 1, 0, 5.0))
    cur = book.current("6.1.0-57-amd64", {"c1c1c1c1"})
    assert {t: r.outcome for t, r in cur.items()} == {"t::a": "passed", "t::b": "passed", "t::c": "skipped",
                                                      "t::f": "passed"}   # the first records' digest: passed over
    assert book.unreadable == 3
    assert book.failed_then_passed("6.1.0-57-amd64", {"c1c1c1c1"}) == ["t::b"]
    assert ledger.todo(["t::a", "t::b", "t::c", "t::d"], cur) == ["t::d"]
    assert ledger.todo(["t::a"], book.current("6.1.0-57-amd64", {"c0c0c0c0"})) == ["t::a"]      # failed there: again
    assert book.current("6.1.0-57-amd64", {"c0c0c0c0", "c1c1c1c1"})["t::a"].outcome == "failed"      # the latest of both
    assert book.current("6.12.107+deb12-amd64", {"c1c1c1c1"}) == {}
    assert [r.minutes for r in book.runs()] == [10.0, 5.0]


def test_a_hostile_records_file_reaches_neither_git_nor_the_table(tmp_path):
    """A records directory copied from elsewhere: a commit that is a git option, numbers that are not, are
    lines passed over; a commit outside the records that is not an id is never given to git."""
    repo = a_repo(tmp_path)
    book = ledger.Ledger(tmp_path / "m")
    book.dir.mkdir()
    target = tmp_path / "written-by-git"
    good = rec("t::a", "passed", commit=ledger.head(repo, SEL)).__dict__
    book.records_path.write_text("\n".join(json.dumps(d) for d in [
        good, {**good, "test": "t::b", "commit": f"--output={target}"}, {**good, "test": "t::c", "seconds": "1"},
        {**good, "test": "t::d", "seconds": float("nan")}, {**good, "test": "t::e", "at": True}]) + "\n")
    book.runs_path.write_text(json.dumps({"kernel": "k", "run": "r", "commit": "a" * 40, "tests": 1,
                                          "recorded": 1, "rc": "0", "minutes": 1.0}) + "\n")
    assert [r.test for r in book.records()] == ["t::a"] and book.unreadable == 4
    assert book.runs() == []
    assert ledger.valid_commits(repo, {f"--output={target}", good["commit"]}, SEL) == {good["commit"]}
    assert not target.exists()


def test_a_directory_that_cannot_hold_the_records_is_refused(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(SpecError, match="not a directory"):
        ledger.Ledger.check(tmp_path / "f")
    (tmp_path / "d" / "records.jsonl").mkdir(parents=True)
    with pytest.raises(SpecError, match="not a file"):
        ledger.Ledger.check(tmp_path / "d")


# --- the matrix's --resume with a stand-in guest runner ------------------------------------------------

RUNNER = r'''#!{python}
"""Stand-in for scripts/guest-test.sh: writes a report log for the node ids it is given into --keep, with
the outcomes in outcomes.json (default passed); stops after "stop_after" tests (a run out of time), or
waits for SIGTERM there when "hang" is set."""
import json, signal, sys, time
from pathlib import Path
here = Path(__file__).resolve().parent.parent
argv = sys.argv[1:]
keep = Path(argv[argv.index("--keep") + 1])
ids = [a for a in argv[argv.index("--") + 1:] if not a.startswith("-")]
with open(here / "calls.jsonl", "a") as f:
    f.write(json.dumps(ids) + "\n")
plan = json.loads((here / "outcomes.json").read_text()) if (here / "outcomes.json").exists() else {{}}
keep.mkdir(parents=True, exist_ok=True)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
with open(keep / "report.jsonl", "w", buffering=1) as log:
    for i, node in enumerate(ids):
        if i == plan.get("stop_after", -1):
            log.write(json.dumps({{"$report_type": "TestReport", "nodeid": node, "when": "setup",
                                   "outcome": "passed", "duration": 1.0}}) + "\n")
            if plan.get("hang"):
                time.sleep(60)
            print("guest 6.1.0-57-amd64: the guest did not finish", file=sys.stderr)
            sys.exit(3)
        out = plan.get(node, "passed")
        for when in ("setup", "call", "teardown"):
            log.write(json.dumps({{"$report_type": "TestReport", "nodeid": node, "when": when,
                                   "outcome": out if when == "call" else "passed", "duration": 30.0}}) + "\n")
print(f"guest 6.1.0-57-amd64: {{len(ids)}} passed in 1.00s (1 s in the guest)")
sys.exit(1 if "failed" in plan.values() else 0)
'''

TESTS = "import pytest\n" + "".join(f"def test_{c}():\n    pass\n\n" for c in "abcde")


def a_checkout(tmp_path: Path) -> Path:
    """A git checkout with five tests and the stand-in runner at scripts/guest-test.sh."""
    root = tmp_path / "checkout"
    (root / "tests").mkdir(parents=True)
    (root / "scripts").mkdir()
    (root / "tests" / "test_k.py").write_text(TESTS)
    runner = root / "scripts" / "guest-test.sh"
    runner.write_text(RUNNER.format(python=sys.executable))
    runner.chmod(0o755)
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "commit", "-qm", "one")
    return root


@pytest.fixture
def km(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("kernel_matrix", REPO / "bench" / "kernel_matrix.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "ROOT", a_checkout(tmp_path))
    monkeypatch.setattr(mod.os, "geteuid", lambda: 0)
    return mod


def calls(root: Path) -> list[list[str]]:
    p = root / "calls.jsonl"
    return [json.loads(l) for l in p.read_text().splitlines()] if p.exists() else []


def test_a_selection_run_in_two_sittings_is_one_table(km, tmp_path, capsys):
    root, book = km.ROOT, tmp_path / "records"
    ids = [f"tests/test_k.py::test_{c}" for c in "abcde"]
    (root / "outcomes.json").write_text(json.dumps({"stop_after": 3, ids[1]: "skipped"}))
    args = ["--kernel", "6.1.0-57-amd64", "--resume", str(book), "--", "tests/test_k.py"]
    assert km.main(args) == 1                       # not complete: two tests not run
    out = capsys.readouterr().out
    assert "6.1.0-57-amd64" in out and calls(root) == [ids]
    row = km.resumed_row("6.1.0-57-amd64", ids, ledger.Ledger(book), {ledger.head(root, frozenset())})
    assert (row["passed"], row["skipped"], row["not_run"], row["runs"]) == (2, 1, 2, 1)

    (root / "outcomes.json").write_text(json.dumps({ids[4]: "failed"}))
    assert km.main(["--json", *args]) == 1          # the second sitting runs only the two left; one fails
    rows = json.loads(capsys.readouterr().out)
    assert calls(root)[1] == ids[3:]
    assert rows[0] == {
        "kernel": "6.1.0-57-amd64", "hook": "tc clsact", "passed": 3, "failed": 1, "skipped": 1, "errors": 0,
        "not_run": 0, "minutes": 7.5, "guest_minutes": rows[0]["guest_minutes"], "runs": 2,
        "commits": [ledger.head(root, frozenset())[:10]], "failed_tests": [ids[4]], "second_try": []}

    (root / "outcomes.json").write_text("{}")
    assert km.main(args) == 0                       # the third runs the failed test alone, and it passes
    out = capsys.readouterr().out
    assert calls(root)[2] == [ids[4]]
    assert f"6.1.0-57-amd64: passed on a second try: {ids[4]}" in out
    assert km.main(args) == 0 and len(calls(root)) == 3        # nothing left: no guest
    assert km.main(["--dry-run", *args]) == 0 and len(calls(root)) == 3


def test_a_code_change_starts_the_records_afresh_and_a_docs_or_other_test_change_does_not(km, tmp_path, capsys):
    root, book = km.ROOT, tmp_path / "records"
    args = ["--kernel", "6.1.0-57-amd64", "--resume", str(book), "--", "tests/test_k.py"]
    assert km.main(args) == 0
    (root / "README.md").write_text("docs\n")
    (root / "tests" / "test_other.py").write_text("def test_z():\n    pass\n")
    git(root, "add", "README.md", "tests/test_other.py")
    git(root, "commit", "-qm", "docs, another test file")
    assert km.main(args) == 0 and len(calls(root)) == 1      # the records of the first commit hold
    (root / "tests" / "test_k.py").write_text(TESTS + "X = 1\n")
    assert km.main(args) == 2 and len(calls(root)) == 1       # uncommitted code: refused, nothing run
    assert "uncommitted changes to tests/test_k.py" in capsys.readouterr().err
    git(root, "commit", "-qam", "code")
    assert km.main(args) == 0 and len(calls(root)) == 2 and len(calls(root)[1]) == 5


def test_the_runner_s_boot_line_is_cut_to_a_few_arguments(km):
    line = "booting 6.1.0-57-amd64 (2 CPUs, 6144 MiB, emulated), pytest --timeout=900 -rfEs a b c d e f g\n"
    assert km.brief(line) == ("booting 6.1.0-57-amd64 (2 CPUs, 6144 MiB, emulated), pytest --timeout=900 -rfEs a b c d"
                              " ... (3 more words)\n")
    assert km.brief("booting 6.1 (2 CPUs), pytest -rfEs a\n") == "booting 6.1 (2 CPUs), pytest -rfEs a\n"


@pytest.mark.parametrize("args,code,said", [
    (["--kernel", "6.1", "--resume", "R"], 2, "bad kernel version"),
    (["--dry-run"], 2, "give --resume DIR"),
    (["--resume", "R", "--keep", "K"], 2, "leave out --keep"),
    (["--resume", "R", "--timeout-min", "0"], 2, "bad --timeout-min"),
    (["--resume", "R", "--", "tests/test_nothing_here.py"], 2, "pytest found no tests"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_is_run_or_written(km, tmp_path, capsys, args, code, said):
    args = [str(tmp_path / "records") if a == "R" else a for a in args]
    assert km.main(args) == code
    err = capsys.readouterr().err
    assert said in err and len(err.strip().splitlines()) == 1, err
    assert calls(km.ROOT) == [] and not (tmp_path / "records").exists()


def test_a_stopped_resumed_run_records_what_the_guest_finished(tmp_path):
    """SIGTERM to the matrix while a guest runs: the runner is stopped, and the tests it finished are in the
    records (the one it was in is not)."""
    if os.geteuid() != 0:
        pytest.skip("--resume runs guests only as root")
    root, book = a_checkout(tmp_path), tmp_path / "records"
    (root / "bench").mkdir()
    (root / "bench" / "kernel_matrix.py").write_text((REPO / "bench" / "kernel_matrix.py").read_text())
    (root / "outcomes.json").write_text(json.dumps({"stop_after": 2, "hang": True}))
    git(root, "add", ".")
    git(root, "commit", "-qm", "matrix")
    m = subprocess.Popen([sys.executable, str(root / "bench" / "kernel_matrix.py"), "--kernel", "6.1.0-57-amd64",
                          "--resume", str(book), "--", "tests/test_k.py"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        end = time.monotonic() + 60            # until the stand-in hangs in its third test's setup
        while time.monotonic() < end and sum(len(p.read_text().splitlines()) for p in
                                             book.glob("6.1.0-57-amd64/*/report.jsonl")) < 7:
            time.sleep(0.05)
        m.send_signal(signal.SIGTERM)
        assert m.wait(timeout=20) == 143
    finally:
        m.kill()
    recs = ledger.Ledger(book).records()
    assert [r.test.split("::")[1] for r in recs] == ["test_a", "test_b"]
    assert [r.recorded for r in ledger.Ledger(book).runs()] == [2]


def test_without_root_it_says_so_and_runs_nothing_but_a_dry_run_reads_the_records(km, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(km.os, "geteuid", lambda: 1000)
    args = ["--kernel", "6.1.0-57-amd64", "--resume", str(tmp_path / "records"), "--", "tests/test_k.py"]
    assert km.main(args) == 3
    assert "run with sudo" in capsys.readouterr().err and calls(km.ROOT) == []
    assert km.main(["--dry-run", *args]) == 1            # five tests not run yet: not complete
    assert "6.1.0-57-amd64: 5 of 5 tests left to run for this code" in capsys.readouterr().err
    assert calls(km.ROOT) == [] and not (tmp_path / "records").exists()


def test_the_probe_names_what_a_test_left_running_and_nothing_for_a_clean_one(tmp_path):
    """bench/guest_probe.py (the matrix's --probe): a test that leaves a process and a thread behind is
    named with both; the clean test after it is named with neither."""
    (tmp_path / "test_leaky.py").write_text(
        "import subprocess, sys, threading, time\n"
        "def test_leaks():\n"
        "    subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(5)  # the-leaked-one'])\n"
        "    threading.Thread(target=time.sleep, args=(5,), name='a-sleeper', daemon=True).start()\n"
        "def test_clean():\n"
        "    pass\n")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "bench.guest_probe",
                          str(tmp_path / "test_leaky.py")], cwd=REPO, capture_output=True, text=True, timeout=120)
    lines = {m.group(1): l for l in out.stdout.splitlines() if (m := re.match(r"probe: \S+::(\w+): ", l))}
    assert set(lines) == {"test_leaks", "test_clean"}, out.stdout
    assert "left running: " in lines["test_leaks"] and "the-leaked-one" in lines["test_leaks"], lines
    assert "threads left: a-sleeper" in lines["test_leaks"], lines
    assert "left running" not in lines["test_clean"] and "threads left" not in lines["test_clean"], lines
    assert "most cpu: " in lines["test_clean"] and re.search(r"load [0-9.]+, \d+ MiB available, pace [0-9.]+$",
                                                              lines["test_clean"]), lines
    assert out.returncode == 0 and any(l.strip() == "." for l in out.stdout.splitlines()), out.stdout


def test_the_matrix_s_probe_reaches_the_guest_s_pytest(km, tmp_path):
    args = ["--kernel", "6.1.0-57-amd64", "--resume", str(tmp_path / "records"), "--probe", "--", "tests/test_k.py"]
    (km.ROOT / "outcomes.json").write_text("{}")
    km.main(args)
    assert calls(km.ROOT)[0][:1] == ["bench.guest_probe"]      # the stand-in takes "-p"'s value for an id
