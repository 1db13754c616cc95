"""benchmarks/result_file.py: the commit a results file names (a real git repository in tmp)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from benchmarks import result_file


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "config", "user.email", "bench@example.invalid")
    _git(tmp_path, "config", "user.name", "bench")
    (tmp_path / "streams").mkdir()
    (tmp_path / "streams" / "sink.py").write_text("BATCH = 1\n")
    (tmp_path / "benchmarks" / "results").mkdir(parents=True)
    (tmp_path / "benchmarks" / "results" / "x-latest.json").write_text("{}\n")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "first")
    monkeypatch.setattr(result_file, "REPO", tmp_path)
    return tmp_path


def test_a_clean_tree_is_named_by_its_commit(repo: Path) -> None:
    assert result_file.commit() == _git(repo, "rev-parse", "--short", "HEAD")


def test_a_changed_source_file_makes_the_run_dirty(repo: Path) -> None:
    (repo / "streams" / "sink.py").write_text("BATCH = 2\n")
    assert result_file.commit() == _git(repo, "rev-parse", "--short", "HEAD") + "-dirty"


def test_results_written_by_an_earlier_run_do_not_make_the_next_run_dirty(repo: Path) -> None:
    # A run of the same code after another has rewritten its results file measures that commit.
    (repo / "benchmarks" / "results" / "x-latest.json").write_text('{"p99_s": 1.0}\n')
    assert result_file.commit() == _git(repo, "rev-parse", "--short", "HEAD")
