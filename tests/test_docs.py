"""The docs: the site builds with --strict (no broken link, anchor or page left out of the nav), the
reference pages are what the code generates (a flag or metric added without them fails here), the README
stays a README, and every command's --help has examples."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def gen_docs():
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_site_builds_strict(tmp_path):
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(ROOT / "mkdocs.yml"),
                        "--site-dir", str(tmp_path / "site")], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").exists()


def test_reference_pages_are_what_the_code_generates():
    env = {k: v for k, v in os.environ.items() if k != "FLOWPULSE_PREFIX"}
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_docs.py"), "--check"], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr


def test_a_flag_added_without_the_page_fails_the_check(monkeypatch, capsys):
    import flowpulse.cli

    real = flowpulse.cli.build_parser

    def with_a_new_flag():
        parser = real()
        fabric = next(a for a in parser._actions if hasattr(a, "choices") and a.choices and "fabric" in a.choices)
        up = next(a for a in fabric.choices["fabric"]._actions if hasattr(a, "choices") and a.choices
                  and "up" in a.choices).choices["up"]
        up.add_argument("--new-flag", help="a flag nobody documented")
        return parser

    monkeypatch.setattr(flowpulse.cli, "build_parser", with_a_new_flag)
    assert gen_docs().main(["--check"]) == 1
    assert "docs/reference/cli.md" in capsys.readouterr().err


def test_a_metric_added_without_the_page_fails_the_check(monkeypatch, capsys):
    from prometheus_client.core import GaugeMetricFamily

    import agent.metrics

    real = agent.metrics.AgentCollector.collect

    def with_a_new_series(self):
        yield from real(self)
        yield GaugeMetricFamily("flowpulse_new_series", "a series nobody documented", labels=["switch"])

    monkeypatch.setattr(agent.metrics.AgentCollector, "collect", with_a_new_series)
    assert gen_docs().main(["--check"]) == 1
    err = capsys.readouterr().err
    assert "docs/reference/metrics.md" in err and "cli.md" not in err


def test_every_exit_code_and_schema_is_on_its_page():
    from flowpulse.errors import ExitCode

    codes = (ROOT / "docs" / "reference" / "exit-codes.md").read_text()
    for code in ExitCode:
        assert f"| {int(code)} | `{code.name}` |" in codes
    schemas = (ROOT / "docs" / "reference" / "schemas.md").read_text()
    shipped = {str(p.relative_to(ROOT)) for pkg in ("agent", "analysis", "netns_testbed")
               for p in (ROOT / pkg).rglob("*.schema.json")}
    assert shipped == {rel for rel, _ in gen_docs().SCHEMAS}, "a schema is missing from scripts/gen_docs.py"
    for rel in shipped:
        assert f"`{rel}`" in schemas


def test_the_readme_is_short_and_its_links_hold():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    assert links
    for link in links:
        if "://" not in link:
            assert (ROOT / link).exists(), link


@pytest.mark.parametrize("command", [" ".join(p) for p, _, _ in
                                     gen_docs()._commands(__import__("flowpulse.cli").cli.build_parser(),
                                                          ["flowpulse"])])
def test_every_command_has_examples(command):
    from flowpulse.cli import build_parser

    parser = next(p for path, _, p in gen_docs()._commands(build_parser(), ["flowpulse"])
                  if " ".join(path) == command)
    assert parser.epilog and "example" in parser.epilog
