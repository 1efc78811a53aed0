"""The two packages: ``realformer_nmt`` is the plugin (what ``--user-dir`` loads) and
imports without the tools' dependencies; ``realformer_tools`` sits beside it, imports the
plugin, and the plugin never imports it, under any environment; the tools' imports form no
circle.

The import graph is read from the source (``ast``), not from what one run happens to
import: an import inside a function counts as much as one at the top, and importing
``a.b.c`` counts as importing the packages ``a`` and ``a.b`` too (their ``__init__``
runs first)."""

import ast
import json
import os
import subprocess
import sys

import pytest
from conftest import REPO

PLUGIN, TOOLS = "realformer_nmt", "realformer_tools"
# What only the tools need (setup.py's `tools` and `hf` extras): the plugin must import without
# them. scipy and sacrebleu are in those extras too, but fairseq-fixed requires them itself
# (sacrebleu directly, scipy through scikit-learn) and imports them when it loads, so a Python
# with fairseq-fixed has them: the plugin's own code must not import them (checked statically).
TOOLS_ONLY = ("sacremoses", "subword_nmt", "tensorboardX", "matplotlib", "transformers", "sentencepiece")
FAIRSEQS_OWN = ("scipy", "sacrebleu")
# The variables the launcher reads, and the one the plugin read before the fixes left it: none of
# them makes the plugin import anything of the tools.
SWITCHES = ("REALFORMER_NMT_DATA_FIXES", "REALFORMER_NMT_BF16_DECODING", "REALFORMER_NMT_CPU_BF16",
            "REALFORMER_NMT_FAIRSEQ_FIXES")


def _modules(package):
    """``{module name: (path, is_package)}`` of every module under ``package``."""
    found = {}
    for path in sorted((REPO / package).rglob("*.py")):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        found[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return found


def _imports(name, path, is_package, known):
    """The modules ``name`` imports (at any depth of its code), resolved to the modules in
    ``known`` where they are ours (``from pkg import mod`` is ``pkg.mod``), else as written."""
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                targets.add(sub if sub in known else module)
    resolved = set()
    for target in targets:
        while target and target not in known and target.count("."):
            target = target.rpartition(".")[0]  # a name inside a module -> the module
        if target != name:
            resolved.add(target)
    return resolved


def _graph(package):
    known = {**_modules(PLUGIN), **_modules(TOOLS)}
    return {name: _imports(name, path, is_package, known)
            for name, (path, is_package) in _modules(package).items()}, known


def _parents(name, known):
    """The packages above ``name`` that are ours (``a.b.c`` -> ``a``, ``a.b``)."""
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in known}


def _with_packages(graph, known):
    """``graph`` with the edges Python adds: a module imports the packages above it, and
    importing a module imports the packages above it (each package's ``__init__``)."""
    return {name: set().union(targets, _parents(name, known), *(_parents(t, known) for t in targets))
            for name, targets in graph.items()}


def _between_packages(graph):
    """The (importer, imported) top-level packages of the edges that cross from one to the other."""
    return {(name.split(".")[0], t.split(".")[0]) for name, targets in graph.items() for t in targets
            if t.split(".")[0] in (PLUGIN, TOOLS) and t.split(".")[0] != name.split(".")[0]}


def _cycles(graph):
    """The strongly connected components with more than one module (Tarjan), sorted."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_cycle_finder_finds_a_circle_and_no_false_one():
    """The finder itself, on graphs whose answer is known."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": set(), "d": {"a", "c"}}) == []
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"c"}}) == [["a", "b"], ["c", "d"]]


def test_import_resolution_reads_relative_lazy_and_typing_only_imports(tmp_path):
    source = tmp_path / "mod.py"
    source.write_text("from . import sibling\nfrom ..other import thing\n"
                      "def f():\n    from .sibling import name\n"
                      "if False:\n    from pkg.sub.third import T\n")
    known = {"pkg.sub.mod": None, "pkg.sub.sibling": None, "pkg.other": None, "pkg.sub.third": None}
    assert _imports("pkg.sub.mod", source, False, known) == {"pkg.sub.sibling", "pkg.other", "pkg.sub.third"}


def test_the_tools_import_each_other_without_a_circle():
    graph, _ = _graph(TOOLS)
    assert len(graph) > 50  # the whole package was read
    assert _cycles(graph) == [], "import circles among the tools' modules"


def test_the_plugin_imports_without_a_circle():
    graph, _ = _graph(PLUGIN)
    assert _cycles(graph) == []


def test_the_two_packages_together_import_without_a_circle():
    plugin, _ = _graph(PLUGIN)
    tools, _ = _graph(TOOLS)
    assert _cycles({**plugin, **tools}) == [], "an import circle across the plugin and the tools"


def test_only_the_tools_import_the_plugin_counting_package_inits():
    """Every import edge between the two packages, the packages' ``__init__`` edges included,
    goes from the tools to the plugin."""
    plugin, known = _graph(PLUGIN)
    tools, _ = _graph(TOOLS)
    both = _with_packages({**plugin, **tools}, known)
    assert both[f"{TOOLS}.fairseq_fixes.bf16_without_tpu"] >= {TOOLS, f"{TOOLS}.fairseq_fixes", PLUGIN,
                                                               f"{PLUGIN}.errors"}
    assert _between_packages(both) == {(TOOLS, PLUGIN)}
    assert tools[TOOLS] == set()  # the tools' __init__ imports nothing (no "plugin first" order to keep)


def test_the_package_edges_find_a_circle_through_an_init():
    """What the test above reads, on the layout the plugin had: a plugin module importing
    ``realformer_tools.fairseq_fixes`` (whose ``__init__`` imports the plugin's errors) is an edge
    plugin -> tools, and with the ``__init__`` edges a circle through both packages."""
    known = {PLUGIN: None, f"{PLUGIN}.errors": None, f"{PLUGIN}.switch": None, TOOLS: None,
             f"{TOOLS}.fairseq_fixes": None}
    graph = {PLUGIN: {f"{PLUGIN}.switch"}, f"{PLUGIN}.switch": {f"{TOOLS}.fairseq_fixes"}, f"{PLUGIN}.errors": set(),
             TOOLS: {PLUGIN}, f"{TOOLS}.fairseq_fixes": {f"{PLUGIN}.errors"}}
    assert _cycles(graph) == []  # read without the __init__ edges, no circle: how the old test passed
    with_packages = _with_packages(graph, known)
    assert _between_packages(with_packages) == {(PLUGIN, TOOLS), (TOOLS, PLUGIN)}
    assert any(PLUGIN in c and TOOLS in c for c in _cycles(with_packages))


def test_the_plugin_imports_no_tools_dependency():
    graph, _ = _graph(PLUGIN)
    found = sorted((name, target) for name, targets in graph.items() for target in targets
                   if target.split(".")[0] in TOOLS_ONLY + FAIRSEQS_OWN)
    assert found == []


def test_the_plugin_never_imports_the_tools():
    graph, known = _graph(PLUGIN)
    found = {(str(known[name][0].relative_to(REPO)), target)
             for name, targets in graph.items() for target in targets if target.split(".")[0] == TOOLS}
    assert found == set(), f"the plugin imports the tools: {sorted(found)}"


# The plugin imported in a fresh Python where every tools-only package and the tools package
# itself raise ImportError.
BLOCKED_IMPORT = r"""
import importlib.abc, json, sys
blocked, allowed = json.loads(sys.argv[1]), json.loads(sys.argv[2])
tried = []

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        # an allowed module, its submodules and the packages above it pass
        if top in blocked and not any(name == a or name.startswith(a + ".") or a.startswith(name + ".")
                                      for a in allowed):
            tried.append(name)
            raise ImportError(f"{name} is blocked: the plugin must import without it")
        return None

sys.meta_path.insert(0, Block())
import realformer_nmt  # noqa: E402
from fairseq.models import ARCH_MODEL_REGISTRY, MODEL_REGISTRY  # noqa: E402
from fairseq.tasks import TASK_REGISTRY  # noqa: E402
from fairseq.criterions import CRITERION_REGISTRY  # noqa: E402
from fairseq.data.encoders import BPE_REGISTRY  # noqa: E402
print(json.dumps({
    "models": sorted(m for m in MODEL_REGISTRY if m.startswith("realformer")),
    "archs": sorted(a for a in ARCH_MODEL_REGISTRY if a.startswith("realformer")),
    "task": "masked_lm_nsp" in TASK_REGISTRY,
    "criterions": sorted(c for c in ("masked_lm_acc", "masked_lm_nsp") if c in CRITERION_REGISTRY),
    "wordpiece": "wordpiece" in BPE_REGISTRY,
    "tools_loaded": sorted(m for m in sys.modules if m.split(".")[0] == "realformer_tools"),
    "tried": tried,
}))
"""


@pytest.mark.parametrize("switch", (None,) + SWITCHES)
def test_the_plugin_registers_without_the_tools_or_their_dependencies(tmp_path, switch):
    """With no switch set, or any one of them set to 1: the plugin reads none of them."""
    allowed = []
    env = {k: v for k, v in os.environ.items() if k not in SWITCHES}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in sys.path if p])
    if switch:
        env[switch] = "1"
    proc = subprocess.run([sys.executable, "-c", BLOCKED_IMPORT, json.dumps(list(TOOLS_ONLY) + [TOOLS]),
                           json.dumps(allowed)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["models"] == ["realformer_bert", "realformer_transformer"]
    assert {"realformer_transformer", "realformer_bert_base", "realformer_bert_small"} <= set(out["archs"])
    assert out["task"] and out["criterions"] == ["masked_lm_acc", "masked_lm_nsp"] and out["wordpiece"]
    assert out["tools_loaded"] == []


def test_the_blocking_finder_does_block(tmp_path):
    """The import test above can fail: with ``realformer_nmt`` itself blocked the same
    program exits with its ImportError."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO)] + [p for p in sys.path if p]))
    proc = subprocess.run([sys.executable, "-c", BLOCKED_IMPORT, json.dumps([PLUGIN]), "[]"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "realformer_nmt is blocked" in proc.stderr


def test_a_fix_imports_first_in_a_fresh_python(tmp_path):
    """A fix's module imported before anything else of the project (as a test of it does),
    with ``realformer_tools/__init__.py`` importing nothing: the fixes import the plugin's
    errors, and the plugin imports nothing of the tools, so no module is met half-imported
    (``preprocess_checks`` also imports the tools' ``data.pipeline``)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO)] + [p for p in sys.path if p]))
    proc = subprocess.run([sys.executable, "-c", "import realformer_tools.fairseq_fixes.preprocess_checks"],
                          cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_the_hf_modeling_files_import_neither_package():
    """The modeling files shipped into every export import torch and transformers only."""
    modeling = REPO / TOOLS / "hf" / "modeling"
    files = sorted(modeling.glob("*.py"))
    assert len(files) >= 4
    known = {**_modules(PLUGIN), **_modules(TOOLS)}
    for path in files:
        if path.name == "__init__.py":
            continue
        name = ".".join(path.relative_to(REPO).with_suffix("").parts)
        ours = {t for t in _imports(name, path, False, known)
                if t.split(".")[0] in (PLUGIN, TOOLS, "fairseq") and not t.startswith(name.rpartition(".")[0] + ".")}
        assert not ours, (path.name, ours)


def test_the_layout_is_the_documented_one():
    """The plugin holds the model and nothing else; the tools' folders are where
    docs/development.md says."""
    plugin = sorted(p.name for p in (REPO / PLUGIN).iterdir() if not p.name.startswith((".", "__pycache__")))
    assert [p for p in plugin if p not in ("__init__.py", "errors.py", "residual_config.py", "modules", "models",
                                           "tasks", "criterions")] == []
    assert sorted(p.name for p in (REPO / PLUGIN / "models").iterdir() if p.is_dir() and p.name != "__pycache__") \
        == ["realformer_bert", "realformer_transformer"]
    for folder in ("cli", "fairseq_fixes", "data", "experiments", "convert", "hf", "hf/modeling"):
        assert (REPO / TOOLS / folder / "__init__.py").is_file(), folder
