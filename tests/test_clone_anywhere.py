"""A clone outside this workspace passes its tests: the real corpora (``../shared/data``,
beside the checkout only here) are read only by tests that skip without them.

Checked from the source, without running the tests: ``conftest.py`` is the one place that
spells the path (``SHARED_DATA``, ``MULTI30K``, ``WIKITEXT2``), and every function of tests/
that names one of those (or a module-level alias of one) calls ``require_shared_data()``,
or a helper that calls it (``prepared_wikitext2``), before it can read a file. A test that
opened ``WIKITEXT2 / "valid.txt"`` without it failed in every other clone.
"""

import ast
import os
from pathlib import Path

import pytest
from conftest import require_shared_data

TESTS = Path(__file__).resolve().parent
THIS = Path(__file__).name  # the checker: its examples name the path
CORPUS_NAMES = {"SHARED_DATA", "MULTI30K", "WIKITEXT2"}
GUARD = "require_shared_data"
PATH_CALLS = {"str", "Path", "join", "normpath", "fspath"}  # what builds a path without reading it


def _names(node):
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _called(node):
    """Names of the functions a node calls (``f(...)`` and ``module.f(...)``)."""
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            f = n.func
            out.add(f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None)
    return out - {None}


def _functions(tree):
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def unguarded(sources):
    """``["file:line name"]`` of every function in ``sources`` ({file name: code}) that names
    a corpus path without calling the guard (directly or through a guarded helper), and of
    every module-level use of one that is not an import or an alias; and every spelling of
    the path (a ``"shared"`` string) outside conftest.py."""
    trees = {name: ast.parse(code) for name, code in sources.items()}
    guarded = {GUARD}
    changed = True
    while changed:  # helpers that call the guard, or a helper that does, are guards too
        changed = False
        for tree in trees.values():
            for fn in _functions(tree):
                if fn.name not in guarded and _called(fn) & guarded:
                    guarded.add(fn.name)
                    changed = True
    problems = []
    for name, tree in trees.items():
        corpus = set(CORPUS_NAMES)
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            value = node.value if isinstance(node, ast.Assign) else node
            if not _names(value) & corpus:
                continue
            if isinstance(node, ast.Assign) and _called(value) <= PATH_CALLS:  # an alias: M = MULTI30K / "x"
                corpus |= {t.id for target in node.targets for t in ast.walk(target) if isinstance(t, ast.Name)}
            else:
                problems.append(f"{name}:{node.lineno} module level")
        for fn in _functions(tree):
            body = ast.Module(body=fn.body, type_ignores=[])
            if _names(body) & corpus and not _called(body) & guarded:
                problems.append(f"{name}:{fn.lineno} {fn.name}")
        if name != "conftest.py":
            problems += [f"{name}:{n.lineno} spells the path" for n in ast.walk(tree)
                         if isinstance(n, ast.Constant) and n.value == "shared"]
    return problems


def test_every_test_that_names_a_real_corpus_skips_without_it():
    sources = {str(p.relative_to(TESTS)): p.read_text(encoding="utf-8") for p in sorted(TESTS.rglob("*.py"))
               if p.name != THIS}
    assert "conftest.py" in sources and "test_wordpiece.py" in sources
    problems = unguarded(sources)
    assert not problems, ("these read ../shared/data without require_shared_data() (they fail in any clone "
                          "outside this workspace):\n" + "\n".join(problems))


def test_the_check_finds_an_unguarded_read_an_alias_and_a_spelling():
    sources = {
        "conftest.py": 'SHARED_DATA = REPO.parent / "shared" / "data"\nWIKITEXT2 = SHARED_DATA / "wikitext-2"\n',
        "helpers.py": "def prepared(f):\n    require_shared_data(WIKITEXT2)\n    return f\n",
        "test_a.py": ("M = MULTI30K / 'x'\nLINES = open(WIKITEXT2).read()\n"
                      "def test_bad():\n    return (WIKITEXT2 / 'valid.txt').read_text()\n"
                      "def test_alias():\n    return M.read_text()\n"
                      "def test_direct():\n    require_shared_data(MULTI30K)\n    return M.read_text()\n"
                      "def test_through_helper(f):\n    prepared(f)\n    return WIKITEXT2\n"
                      "def test_spelt():\n    return REPO.parent / 'shared'\n"),
    }
    assert unguarded(sources) == ["test_a.py:2 module level", "test_a.py:3 test_bad", "test_a.py:5 test_alias",
                                  "test_a.py:14 spells the path"]


def test_a_missing_corpus_skips_naming_it_and_fails_under_ci(tmp_path, monkeypatch):
    missing = tmp_path / "shared" / "data" / "multi30k"
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match=f"{missing} not available .the real corpus this test reads."):
        require_shared_data(tmp_path, missing)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI is set, where it must be present"):
        require_shared_data(missing)
    require_shared_data(tmp_path)  # present: nothing happens, CI or not
    assert os.path.isdir(tmp_path)
