"""The training corpus: which files it reads, and a split by file that is stable and disjoint."""

from __future__ import annotations

import hashlib
import shutil

import pytest

from dlrt.train.corpus import held_out_fraction, is_held_out, load_corpus, source_paths


@pytest.fixture()
def tree(tmp_path):
    """A fake standard library: 60 modules, a package, tests, and files the corpus skips."""
    root = tmp_path / "lib"
    (root / "pkg").mkdir(parents=True)
    for i in range(60):
        (root / f"mod{i}.py").write_text(f"def f{i}(x):\n    return x + {i}\n")
    (root / "pkg" / "__init__.py").write_text("from .core import *\n")
    (root / "pkg" / "core.py").write_text("VALUE = 1\n")
    for folder in ("test", "pkg/tests"):
        (root / folder).mkdir(parents=True)
        (root / folder / "test_a.py").write_text("assert True\n")
    for folder in ("site-packages/thirdparty", "__pycache__"):
        (root / folder).mkdir(parents=True)
        (root / folder / "x.py").write_text("skipped = True\n")
    (root / "_sysconfigdata__linux.py").write_text("build_time_vars = {}\n")
    (root / "latin1.py").write_bytes(b"# caf\xe9\n")
    (root / "notes.txt").write_text("not python\n")
    return root


def test_reads_python_files_and_skips_the_rest(tree):
    paths = source_paths(tree)
    assert "pkg/core.py" in paths and "test/test_a.py" in paths and "pkg/tests/test_a.py" in paths
    assert not [p for p in paths if "site-packages" in p or "__pycache__" in p
                or "_sysconfigdata" in p or not p.endswith(".py")]
    no_tests = source_paths(tree, include_tests=False)
    assert set(paths) - set(no_tests) == {"test/test_a.py", "pkg/tests/test_a.py"}
    corpus = load_corpus(tree, held_out_share=0.2)
    assert corpus.skipped == ["latin1.py"]  # not UTF-8
    assert corpus.record()["files"]["skipped_not_utf8"] == 1


def test_split_is_by_file_disjoint_and_complete(tree):
    corpus = load_corpus(tree, held_out_share=0.2)
    train = dict(corpus.train)
    held = dict(corpus.held_out)
    assert train and held and not set(train) & set(held)
    assert set(train) | set(held) | set(corpus.skipped) == set(source_paths(tree))
    for rel, text in [*train.items(), *held.items()]:  # whole files, never pieces
        assert text == (tree / rel).read_text()
    record = corpus.record()
    assert record["files"]["train"] == len(train)
    assert record["chars"]["held_out"] == sum(len(t) for t in held.values())


def test_split_is_stable_across_machines(tree, tmp_path):
    """The same tree elsewhere splits the same way: the hash is of the relative path."""
    first = load_corpus(tree, held_out_share=0.2)
    copy = shutil.copytree(tree, tmp_path / "elsewhere" / "python3.12")
    second = load_corpus(copy, held_out_share=0.2)
    assert [r for r, _ in first.held_out] == [r for r, _ in second.held_out]
    assert [r for r, _ in first.train] == [r for r, _ in second.train]
    for rel, _ in first.held_out:
        digest = hashlib.sha1(rel.encode()).digest()
        assert int.from_bytes(digest[:8], "big") / 2**64 < 0.2


def test_held_out_share_is_about_five_percent():
    names = [f"pkg{i // 50}/module_{i}.py" for i in range(4000)]
    share = sum(is_held_out(n) for n in names) / len(names)
    assert 0.04 < share < 0.06
    assert all(0 <= held_out_fraction(n) < 1 for n in names[:50])


def test_missing_root(tmp_path):
    with pytest.raises(FileNotFoundError):
        load_corpus(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no readable"):
        load_corpus(tmp_path / "empty")
