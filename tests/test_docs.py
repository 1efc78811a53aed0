"""The README and docs/ stay true to the code: links resolve, and the commands they show
run as written, as far as that can be checked in seconds without training anything.

* every relative link (and image) in README.md and docs/*.md points to an existing file
  or folder, and a ``#heading`` anchor to a heading of that page (GitHub's anchor rule);
* every ``python scripts/<name>.py`` named anywhere exists and answers ``--help`` with
  exit status 0 (and so does every ``python -m realformer_tools...`` module named);
* every command in a ```bash block that runs ``python scripts/X.py`` or
  ``python -m realformer_tools.X`` gets its arguments accepted by that script's own parser
  (its ``parse_args(argv)`` with the script's own checks, or ``main(argv)`` stopped right
  after argparse), and every ``fairseq-train/-generate/-interactive/-preprocess/-validate/
  -eval-lm`` command gets its flags accepted by fairseq's own parser with the plugin loaded
  (``options.parse_args_and_arch``: data paths need not exist), and RealFormer's flag
  values by ``residual_config.resolve``;
* every ``make <target>`` named exists in the Makefile; every ``scripts/``, ``tests/`` and
  ``realformer_nmt/`` and ``realformer_tools/`` file named exists;
* ```python blocks compile; the README stays a front page (at most 250 lines).

How commands are read from a bash block: lines ending in ``\\`` are joined, ``# comments``
dropped, a line is cut at ``;``, ``&&``, ``||``, ``|`` and ``&``; leading ``VAR=value``
assignments, ``do``/``then``, ``export`` and the launcher ``realformer-fairseq [--data-fixes]
[--bf16-decoding] [--verbose]`` are set aside (the fairseq command it runs is checked), and ``$VAR`` takes the value
the block gave it (``DIR=...``, ``export A=... B=...``, ``for R in 0 1`` -> 0). A ``...``
argument stands for "more of the same" and is left out; a command with an ``<angle>``
placeholder is skipped, as are ``fairseq-hydra-train`` (Hydra overrides, not flags) and
commands after a redirection (``>``, ``<``) in the same line part.
"""

import argparse
import contextlib
import importlib
import importlib.util
import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import USER_DIR

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md"] + sorted((REPO / "docs").glob("*.md"))
README_MAX_LINES = 250

FAIRSEQ_TOOLS = ("fairseq-train", "fairseq-generate", "fairseq-interactive", "fairseq-preprocess",
                 "fairseq-validate", "fairseq-eval-lm")
SKIPPED_TOOLS = ("fairseq-hydra-train",)
PYTHONS = ("python", "python3", "python3.11", ".venv/bin/python")


def rel(path):
    return str(Path(path).relative_to(REPO))


# --------------------------------------------------------------------------------------
# Reading markdown: fenced blocks, prose, headings, links
# --------------------------------------------------------------------------------------

FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})(.*)$")


def split_markdown(text):
    """``(blocks, prose)``: ``blocks`` = [(language, first line number, code)], ``prose`` =
    the text outside fenced blocks (fence lines blanked, so line numbers stay)."""
    blocks, prose, lines = [], [], text.split("\n")
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            prose.append(lines[i])
            i += 1
            continue
        fence, lang, start = m.group(2), m.group(3).strip().lower(), i + 1
        body = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        blocks.append((lang, start + 1, "\n".join(body)))
        prose.extend([""] * (len(body) + 2))
        i += 1
    return blocks, "\n".join(prose)


def slug(heading):
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces -> '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # links keep their text
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page):
    _, prose = split_markdown(page.read_text(encoding="utf-8"))
    seen, out = {}, set()
    for line in prose.split("\n"):
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            out.add(base if n == 0 else f"{base}-{n}")
            seen[base] = n + 1
    return out


LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def links(page):
    """``(line, target)`` of every markdown link and image outside code."""
    _, prose = split_markdown(page.read_text(encoding="utf-8"))
    prose = re.sub(r"`[^`\n]*`", lambda m: " " * len(m.group(0)), prose)  # inline code is not a link
    for number, line in enumerate(prose.split("\n"), 1):
        for m in LINK.finditer(line):
            yield number, m.group(1)


def link_problems(page):
    problems = []
    for line, target in links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        where = f"{rel(page)}:{line}: {target}"
        if not dest.exists():
            problems.append(f"{where}: no such file {rel(dest) if dest.is_relative_to(REPO) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{where}: no heading with anchor #{anchor} in {rel(dest)}")
    return problems


# --------------------------------------------------------------------------------------
# Reading commands out of bash blocks
# --------------------------------------------------------------------------------------

SEPARATORS = {";", "&&", "||", "|", "&", ";;"}
REDIRECTIONS = re.compile(r"^(<|<<|\d?>.*|&>.*)$")  # <, >, >>, 2>, >file (a <placeholder> is not one)
PLACEHOLDER = re.compile(r"^<[^<>]+>$")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
VARIABLE = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?")
# the launcher that runs a fairseq command with the fixes to fairseq 0.12 (realformer_tools/launch.py)
LAUNCHERS = ("realformer-fairseq",)
LAUNCHER_FLAGS = ("--data-fixes", "--bf16-decoding", "--cpu-bf16", "--verbose")  # launch.OPTIONS
# a command's output a block assigns (USER_DIR="$(realformer-nmt-user-dir)"): what it prints here
COMMAND_VALUES = {"$(realformer-nmt-user-dir)": str(REPO / "realformer_nmt")}


def logical_lines(code):
    """Lines of a shell block with ``\\`` continuations joined and quotes spanning lines kept
    together."""
    out, pending = [], ""
    for line in code.split("\n"):
        if pending:
            pending += ("\n" if not pending.endswith(" ") else "") + line
        else:
            pending = line
        if pending.rstrip().endswith("\\"):
            pending = pending.rstrip()[:-1] + " "
            continue
        try:
            shlex.split(pending, comments=True)
        except ValueError:  # an open quote: the string goes on on the next line
            continue
        out.append(pending)
        pending = ""
    if pending.strip():
        out.append(pending)
    return out


def tokens(line):
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    return list(lexer)


def commands(code):
    """Every simple command of a bash block: ``(words, text)`` with variables substituted,
    assignments / ``do`` / ``then`` removed; ``words`` is None for a skipped command."""
    variables = {}
    for line in logical_lines(code):
        words = tokens(line)
        parts, part = [], []
        for word in words:
            if word in SEPARATORS:
                parts.append(part)
                part = []
            else:
                part.append(word)
        parts.append(part)
        for part in parts:
            while part and part[0] in ("do", "then", "else", "{", "(", "done", "fi", "}"):
                part = part[1:]
            if not part:
                continue
            if part[0] == "for" and len(part) >= 4 and part[2] == "in":
                variables[part[1]] = part[3]
                continue
            if part[0] == "export":
                part = part[1:]
            while part and ASSIGNMENT.match(part[0]):
                name, _, value = part[0].partition("=")
                value = COMMAND_VALUES.get(value, value)
                variables[name] = VARIABLE.sub(lambda m: variables.get(m.group(1), m.group(0)), value)
                part = part[1:]
            if part and part[0] in LAUNCHERS:  # the fairseq command it runs is what gets checked
                part = part[1:]
                while part and part[0] in LAUNCHER_FLAGS:
                    part = part[1:]
            if not part:
                continue
            if any(PLACEHOLDER.match(w) for w in part):
                yield None, " ".join(part)  # a placeholder: nothing to check
                continue
            cut = next((i for i, w in enumerate(part) if REDIRECTIONS.match(w)), len(part))
            part = [VARIABLE.sub(lambda m: variables.get(m.group(1), m.group(1).lower()), w) for w in part[:cut]]
            text = " ".join(part)
            yield [w for w in part if w != "..."], text


def bash_commands():
    """``(page, line, words, text)`` for every command of every bash block."""
    for page in PAGES:
        blocks, _ = split_markdown(page.read_text(encoding="utf-8"))
        for lang, line, code in blocks:
            if lang in ("bash", "sh", "shell", "console"):
                for words, text in commands(code):
                    yield page, line, words, text


def invocation(words):
    """What a command runs: ``("script", name, args)``, ``("module", name, args)``,
    ``("fairseq", tool, args)``, ``("make", target, args)`` or None."""
    if not words:
        return None
    head = words[0]
    if head in PYTHONS and len(words) > 1:
        if words[1] == "-m" and len(words) > 2 and words[2].startswith(("realformer_nmt", "realformer_tools")):
            return "module", words[2], words[3:]
        m = re.match(r"^scripts/([\w-]+)\.py$", words[1])
        if m:
            return "script", m.group(1), words[2:]
        return None
    if head in FAIRSEQ_TOOLS:
        return "fairseq", head, words[1:]
    if head == "make":
        targets = [w for w in words[1:] if not w.startswith("-") and "=" not in w]
        return "make", (targets[0] if targets else None), words[1:]
    return None


# --------------------------------------------------------------------------------------
# Parsing arguments the way the tools do
# --------------------------------------------------------------------------------------

class ArgumentRefused(Exception):
    pass


class _Parsed(Exception):
    pass


@contextlib.contextmanager
def argparse_raises(stop_after_parse=False):
    """argparse errors raise ArgumentRefused (message kept) instead of printing and exiting;
    with ``stop_after_parse``, a successful ``parse_args`` raises _Parsed. Parsers built
    meanwhile take no abbreviations: a doc spells every flag out (``--max-upd`` would stop
    working the day another ``--max-upd...`` flag is added)."""
    original_error, original_parse = argparse.ArgumentParser.error, argparse.ArgumentParser.parse_args
    original_init = argparse.ArgumentParser.__init__

    def init(self, *args, **kwargs):
        kwargs["allow_abbrev"] = False
        original_init(self, *args, **kwargs)

    def error(self, message):
        raise ArgumentRefused(message)

    def parse_args(self, args=None, namespace=None):
        result = original_parse(self, args, namespace)
        raise _Parsed(result)

    argparse.ArgumentParser.error = error
    argparse.ArgumentParser.__init__ = init
    if stop_after_parse:
        argparse.ArgumentParser.parse_args = parse_args
    try:
        yield
    finally:
        argparse.ArgumentParser.error = original_error
        argparse.ArgumentParser.parse_args = original_parse
        argparse.ArgumentParser.__init__ = original_init


def load_script(name):
    spec = importlib.util.spec_from_file_location(f"_docs_script_{name}", REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_python_args(module, args):
    """None if ``module``'s own parser accepts ``args``, else the parser's message."""
    try:
        if hasattr(module, "parse_args"):
            with argparse_raises():
                module.parse_args([str(a) for a in args])
        else:
            with argparse_raises(stop_after_parse=True):
                module.main([str(a) for a in args])
            return "main() did not parse its arguments first"
    except _Parsed:
        return None
    except ArgumentRefused as exc:
        return str(exc)
    except SystemExit as exc:
        return f"exit {exc.code}"
    return None


def check_fairseq_args(tool, args):
    """None if fairseq's parser for ``tool`` accepts ``args`` (and RealFormer's flag values
    are valid), else the message."""
    from fairseq import options

    from realformer_nmt import residual_config
    from realformer_nmt.errors import RealFormerError

    parsers = {
        "fairseq-train": options.get_training_parser,
        "fairseq-generate": options.get_generation_parser,
        "fairseq-interactive": options.get_interactive_generation_parser,
        "fairseq-validate": options.get_validation_parser,
        "fairseq-eval-lm": options.get_eval_lm_parser,
        "fairseq-preprocess": options.get_preprocessing_parser,
    }
    parser = parsers[tool]()
    try:
        with argparse_raises():
            if tool == "fairseq-preprocess":
                parsed = parser.parse_args(args)
            else:
                parsed = options.parse_args_and_arch(parser, args)
        arch = getattr(parsed, "arch", None) or ""
        if arch.startswith("realformer"):
            available = ("encoder",) if arch.startswith("realformer_bert") else residual_config.PATHS
            residual_config.resolve(parsed, available)
    except ArgumentRefused as exc:
        return str(exc)
    except RealFormerError as exc:  # ConfigError, and FlagValueError raised while parsing
        return str(exc)
    except SystemExit as exc:
        return f"exit {exc.code}"
    return None


def makefile_targets():
    text = (REPO / "Makefile").read_text(encoding="utf-8")
    targets = set()
    for line in text.split("\n"):
        m = re.match(r"^([A-Za-z0-9_.%/-][A-Za-z0-9_.%/ -]*):(?!=)", line)
        if m:
            targets.update(m.group(1).split())
    return targets


def all_text():
    return [(page, page.read_text(encoding="utf-8")) for page in PAGES]


# --------------------------------------------------------------------------------------
# The tests
# --------------------------------------------------------------------------------------

def test_docs_pages_exist_and_readme_is_a_front_page():
    names = {p.name for p in PAGES}
    for page in ("translation.md", "bert.md", "results.md", "performance.md", "reliability.md",
                 "development.md"):
        assert page in names, f"docs/{page} is missing"
    lines = len((REPO / "README.md").read_text(encoding="utf-8").splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines; keep the front page under {README_MAX_LINES}"


def test_every_relative_link_resolves():
    problems = [p for page in PAGES for p in link_problems(page)]
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_every_named_repository_file_exists():
    problems = []
    pattern = re.compile(r"(?<![\w./-])((?:scripts|tests|realformer_(?:nmt|tools))/[\w./*-]*\w\.(?:py|sh))(?![\w/])")
    for page, text in all_text():
        for m in pattern.finditer(text):
            name = m.group(1)
            if "fairseq's" in text[max(0, m.start() - 12):m.start()]:
                continue  # a file of fairseq's repository, not of this one
            found = list(REPO.glob(name)) if "*" in name else [REPO / name] if (REPO / name).exists() else []
            if not found:
                line = text.count("\n", 0, m.start()) + 1
                problems.append(f"{rel(page)}:{line}: {name} does not exist")
    assert not problems, "\n".join(problems)


def _help_exit(command):
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    return command, done.returncode, done.stderr[-2000:]


def _help_in_process(command):
    """``command`` (``python scripts/x.py --help`` or ``python -m module --help``) in this process
    (runpy, as the interpreter runs a file or ``-m``), argv, streams, logging and the rest put
    back as ``inprocess.run_in_process`` puts them: ``(command, exit status, stderr)``."""
    import io
    import runpy
    import traceback
    import warnings

    import inprocess

    state, out, err = inprocess._ProcessState(), io.StringIO(), io.StringIO()
    try:
        os.chdir(REPO)
        sys.argv[:] = [str(REPO / command[1]) if command[1] != "-m" else command[2], *command[-1:]]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # runpy's note on a module imported before
            try:
                if command[1] == "-m":
                    runpy.run_module(command[2], run_name="__main__", alter_sys=True)
                else:
                    runpy.run_path(sys.argv[0], run_name="__main__")
                code = 0
            except SystemExit as e:
                code = inprocess._exit_code(e.code)
            except Exception:
                traceback.print_exc(file=err)
                code = 1
    finally:
        state.restore()
    return command, code, (err.getvalue() or out.getvalue())[-2000:] if code else ""


def test_every_named_script_and_module_answers_help():
    scripts, modules = set(), set()
    for _, text in all_text():
        scripts.update(re.findall(r"python\S* scripts/([\w-]+)\.py", text))
        modules.update(re.findall(r"python\S* -m (realformer_(?:nmt|tools)(?:\.\w+)+)", text))
    assert scripts, "no `python scripts/...` command found in the docs"
    missing = sorted(s for s in scripts if not (REPO / "scripts" / f"{s}.py").exists())
    assert not missing, f"scripts named in the docs but missing: {missing}"
    commands = [[sys.executable, f"scripts/{s}.py", "--help"] for s in sorted(scripts)]
    commands += [[sys.executable, "-m", m, "--help"] for m in sorted(modules)]
    # one of each kind as a user types it, in a process of its own (a script, and the launcher's
    # module where the docs name it); the others run in this process as Python runs them
    fresh = [commands[0], next((c for c in commands if c[2:3] == ["realformer_tools.launch"]), commands[-1])]
    with ThreadPoolExecutor(max_workers=2) as pool:
        started = pool.map(_help_exit, fresh)
        results = [_help_in_process(c) for c in commands if c not in fresh] + list(started)
    failed = [f"{' '.join(c[1:])}: exit {rc}\n{err}" for c, rc, err in results if rc != 0]
    assert not failed, "\n".join(failed)


def test_script_commands_in_bash_blocks_use_flags_their_parsers_accept(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    monkeypatch.chdir(REPO)
    checked, problems, modules = 0, [], {}
    for page, line, words, text in bash_commands():
        what = invocation(words)
        if what is None or what[0] not in ("script", "module"):
            continue
        kind, name, args = what
        key = (kind, name)
        if key not in modules:
            modules[key] = load_script(name) if kind == "script" else importlib.import_module(name)
        message = check_python_args(modules[key], args)
        checked += 1
        if message:
            problems.append(f"{rel(page)} (block at line {line}): {text}\n    -> {message}")
    assert checked, "no script command found in the bash blocks"
    assert not problems, "commands their script refuses:\n" + "\n".join(problems)


def test_fairseq_commands_in_bash_blocks_use_flags_fairseq_accepts(monkeypatch):
    import realformer_nmt  # noqa: F401  (registers the models, tasks and criterions, as --user-dir does)

    monkeypatch.chdir(REPO)  # --user-dir realformer_nmt is a path relative to the repository
    checked, problems = 0, []
    for page, line, words, text in bash_commands():
        what = invocation(words)
        if what is None or what[0] != "fairseq":
            continue
        _, tool, args = what
        message = check_fairseq_args(tool, args)
        checked += 1
        if message:
            problems.append(f"{rel(page)} (block at line {line}): {text}\n    -> {message}")
    assert checked, "no fairseq command found in the bash blocks"
    assert not problems, "commands fairseq refuses:\n" + "\n".join(problems)


def test_every_make_target_named_exists():
    targets = makefile_targets()
    named = []
    for page, line, words, _ in bash_commands():
        what = invocation(words)
        if what and what[0] == "make":
            named.append((f"{rel(page)} (block at line {line})", what[1]))
    for page, text in all_text():
        _, prose = split_markdown(text)
        for m in re.finditer(r"`make ([^`]*)`", prose):
            words = [w for w in m.group(1).split() if not w.startswith("-") and "=" not in w]
            if words:
                named.append((f"{rel(page)}:{prose.count(chr(10), 0, m.start()) + 1}", words[0]))
    assert named, "no make command found in the docs"
    problems = [f"{where}: make {target}: no such target in the Makefile"
                for where, target in named if target not in targets]
    assert not problems, "\n".join(problems)


def test_python_blocks_are_valid_python():
    problems = []
    for page in PAGES:
        blocks, _ = split_markdown(page.read_text(encoding="utf-8"))
        for lang, line, code in blocks:
            if lang in ("python", "py"):
                try:
                    compile(code, f"{rel(page)}:{line}", "exec")
                except SyntaxError as exc:
                    problems.append(f"{rel(page)} (block at line {line}): {exc}")
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------------------------
# The reader itself (so that a passing check means something)
# --------------------------------------------------------------------------------------

def test_command_reader_joins_continuations_substitutes_variables_and_skips_placeholders():
    code = "\n".join([
        "export MASTER_ADDR=127.0.0.1 WORLD_SIZE=2",
        "DIR=checkpoints/x",
        "for R in 0 1; do",
        "  fairseq-train data --distributed-rank $R \\",
        "    --restore-file $DIR/model.pt &   # a comment",
        "done; wait",
        "OMP_NUM_THREADS=2 python scripts/benchmark_speed.py --tokens 2048 ...  # more",
        "python scripts/x.py --save-dir '<run_dir>'",
        "echo hi | fairseq-interactive data --beam 5 > out.txt",
        "realformer-fairseq --data-fixes fairseq-generate data --beam 5 > out.txt",
    ])
    found = [words for words, _ in commands(code)]
    assert ["fairseq-train", "data", "--distributed-rank", "0", "--restore-file", "checkpoints/x/model.pt"] in found
    assert ["python", "scripts/benchmark_speed.py", "--tokens", "2048"] in found
    assert None in found  # the placeholder command
    assert ["fairseq-interactive", "data", "--beam", "5"] in found
    assert ["fairseq-generate", "data", "--beam", "5"] in found  # the launcher set aside


def test_checks_refuse_a_misspelt_flag():
    import realformer_nmt  # noqa: F401

    assert check_fairseq_args("fairseq-train", ["data", "--arch", "realformer_transformer"]) is None
    assert "--residual-attention-kernal" in check_fairseq_args(
        "fairseq-train", ["data", "--arch", "realformer_transformer", "--residual-attention-kernal", "bias"])
    assert "kernel" in check_fairseq_args(
        "fairseq-train", ["data", "--arch", "realformer_transformer", "--residual-attention-kernel", "flash"])
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        speed = load_script("benchmark_speed")
        kernels = load_script("benchmark_kernels")
    finally:
        sys.path.remove(str(REPO / "scripts"))
    assert check_python_args(speed, ["--tokens", "2048"]) is None
    assert "--tokenz" in check_python_args(speed, ["--tokenz", "2048"])
    assert "--tok" in check_python_args(speed, ["--tok", "2048"])  # no abbreviations
    assert check_python_args(kernels, ["--rounds", "5"]) is None  # main() only: stopped after parsing
    assert "--roundz" in check_python_args(kernels, ["--roundz", "5"])


def test_license_and_citation_files_exist_and_the_readme_names_them():
    import yaml  # PyYAML: omegaconf's dependency, so fairseq's

    assert (REPO / "LICENSE").read_text(encoding="utf-8").startswith("MIT License")
    cff = yaml.safe_load((REPO / "CITATION.cff").read_text(encoding="utf-8"))
    assert cff["cff-version"] == "1.2.0" and cff["license"] == "MIT" and cff["title"]
    papers = [r for r in cff["references"] if r["title"] == "RealFormer: Transformer Likes Residual Attention"]
    assert len(papers) == 1 and papers[0]["year"] == 2021
    assert [a["family-names"] for a in papers[0]["authors"]] == ["He", "Ravula", "Kanagal", "Ainslie"]
    assert any("2012.11747" in str(i["value"]) for i in papers[0]["identifiers"])
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "](LICENSE)" in readme and "](CITATION.cff)" in readme


def test_slug_follows_githubs_rule():
    assert slug("Whole-model benchmark against fairseq's `transformer`") == \
        "whole-model-benchmark-against-fairseqs-transformer"
    assert slug("Post-LN vs Pre-LN vs RealFormer on Multi30k En->De") == \
        "post-ln-vs-pre-ln-vs-realformer-on-multi30k-en-de"
    assert slug("GPU tests (`tests/test_gpu.py`)") == "gpu-tests-teststest_gpupy"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


# --------------------------------------------------------------------------------------
# What a new user reads first (issue 24): the demo on a slow machine, the CPU quick start,
# the two RealFormer figures of the results, the test times
# --------------------------------------------------------------------------------------

def section(page, heading):
    text = (REPO / page).read_text(encoding="utf-8")
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else len(text)]


def fairseq_namespace(tool, words):
    from fairseq import options

    import realformer_nmt  # noqa: F401

    parser = {"fairseq-train": options.get_training_parser,
              "fairseq-generate": options.get_generation_parser}[tool]()
    return vars(options.parse_args_and_arch(parser, [str(w) for w in words]))


def test_demo_section_says_what_a_slow_machine_gets(monkeypatch):
    import importlib

    demo = importlib.import_module("realformer_tools.cli.run_demo")  # what scripts/run_demo.py runs
    readme = " ".join(section("README.md", "Two commands on a fresh machine").split())
    text = " ".join(section("docs/translation.md", "The demo (`make demo`)").split())
    defaults = demo.parse_args([])
    for page in (readme, text):
        assert f"{defaults.max_update} updates" in page and f"capped at {defaults.max_minutes:g} minutes" in page
    assert "(docs/translation.md#the-demo-make-demo)" in readme
    assert "`UNDERTRAINED: ...`" in text and 'print(f"UNDERTRAINED: training stopped early' in \
        (REPO / "realformer_tools" / "cli" / "run_demo.py").read_text(encoding="utf-8")
    monkeypatch.setenv("MAKELEVEL", "1")  # the command the demo prints under `make demo`, verbatim
    assert f"`{demo.continue_command(defaults)}` (no cap; it continues from `checkpoint_last.pt`)" in text
    # make's own report of a failed recipe: "Error <the demo's status>", and make exits 2
    line = next(n for n, row in enumerate((REPO / "Makefile").read_text().splitlines(), 1) if row == "demo: setup")
    assert f"`make: *** [Makefile:{line + 1}: demo] Error 1` and exit status 2" in text
    assert "a first set-up takes about 5 minutes" in text and "set-up 60 s, `make demo` 53 s" in text


def test_translation_docs_give_the_cpu_recipe_of_the_results(monkeypatch):
    """docs/translation.md's comparison recipe is the realformer run of results/multi30k_en_de.json
    (same parsed configuration, paths aside), and its fairseq-generate bounds the output as
    the harness does."""
    monkeypatch.chdir(REPO)
    import json

    recipe = json.loads((REPO / "results" / "multi30k_en_de.json").read_text(encoding="utf-8"))["recipe"]
    blocks, _ = split_markdown(section("docs/translation.md", "The CPU recipe of the comparison (Multi30k)"))
    found = {words[0]: words for lang, _, code in blocks if lang == "bash"
             for words, _ in commands(code) if words and words[0] in ("fairseq-train", "fairseq-generate")}
    readme = fairseq_namespace("fairseq-train", found["fairseq-train"][1:])
    results = fairseq_namespace("fairseq-train", [recipe["data"], *recipe["shared_train_flags"],
                                                  *recipe["backbone_flags"]["realformer"], "--seed", "1",
                                                  "--user-dir", "realformer_nmt"])
    differ = {k: (readme.get(k), results.get(k)) for k in set(readme) | set(results)
              if k not in ("save_dir", "log_format", "log_interval") and readme.get(k) != results.get(k)}
    assert not differ, f"the docs' CPU command differs from the results' recipe: {differ}"
    generate = found["fairseq-generate"]
    flags = recipe["generate_flags"]
    for flag in ("--max-len-a", "--max-len-b", "--beam", "--remove-bpe"):
        assert generate[generate.index(flag) + 1] == flags[flags.index(flag) + 1], flag


def mean_sd(values):
    import statistics

    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def test_the_path_ablation_reuses_the_main_tables_runs_and_says_so():
    """The ablation's "all three" and Post-LN rows are the main comparison's first two seeds (its
    table lives in docs/results.md; the README's plain words link to it)."""
    import json

    main = json.loads((REPO / "results" / "multi30k_en_de.json").read_text(encoding="utf-8"))
    ablation = json.loads((REPO / "results" / "path_ablation.json").read_text(encoding="utf-8"))
    three, two = main["realformer"]["bleu_per_seed"], ablation["all"]["bleu_per_seed"]
    seeds = main["realformer"]["seeds"]
    assert seeds == list(range(1, len(seeds) + 1)) and len(seeds) >= 3 and ablation["recipe"]["seeds"] == [1, 2]
    assert two == three[:2]  # the ablation's "all three" row reuses the main table's runs
    text = " ".join(section("README.md", "Results").split())
    assert "(docs/results.md#which-path-matters-path-ablation-seeds-1-2)" in text and mean_sd(two) not in text
    docs = " ".join(section("docs/results.md", "Which path matters (path ablation), seeds 1-2").split())
    assert "the `all` and Post-LN rows are the main comparison's runs" in docs


def test_development_guide_gives_idle_test_times_and_says_load_multiplies_them():
    text = " ".join(section("docs/development.md", "Running the tests").split())
    # the measured times of the whole suite (make test, two workers) and of make test-fast, then the earlier ones
    assert "13:46" in text and "2:29" in text and "within the 15 minutes" in text
    assert "37:45" in text and "58:04" in text and "53:21 on CI" in text and "PYTEST_WORKERS=0" in text
    assert "**Load multiplies them**" in text
    assert "a few minutes" not in text and "about 20 minutes" not in text


# --------------------------------------------------------------------------------------
# Results a reader takes in at a glance: the summary figure first, every study in one
# shape, no issue numbers (a reader has no issue tracker)
# --------------------------------------------------------------------------------------

def test_readme_results_open_with_the_summary_figure_the_rerender_draws(tmp_path):
    import shutil

    from realformer_tools.experiments.translation import rerender

    lines = [line for line in section("README.md", "Results").splitlines()
             if line.strip() and not line.startswith(("<!--", "## "))]
    assert lines[0].startswith("![") and lines[0].endswith("](results/summary.png)")
    assert "`results/summary.png`" in (REPO / "docs" / "results.md").read_text(encoding="utf-8")
    # the command the docs give draws it, from the study JSONs beside it
    for name in ("multi30k_en_de.json", "mlm_wikitext2.json", "speed_cpu.json"):
        shutil.copy(REPO / "results" / name, tmp_path / name)
    assert rerender.main(sorted(str(p) for p in tmp_path.glob("*.json"))) == 0
    assert (tmp_path / "summary.png").read_bytes().startswith(b"\x89PNG")
    blocks, _ = split_markdown(section("docs/results.md", "The comparison harness"))
    assert any("python -m realformer_tools.experiments.translation.rerender results/*.json" in code
               for lang, _, code in blocks if lang == "bash")


def test_plain_words_are_at_most_eight_bullets_each_with_a_number_and_a_link():
    text = section("README.md", "Results")
    plain = text[text.index("**In plain words**"):]
    plain = plain[:plain.index("\n\n", plain.index("\n- "))]
    bullets = re.split(r"\n- ", plain)[1:]
    assert 1 <= len(bullets) <= 8
    for bullet in bullets:
        assert re.search(r"[+-]?\d+\.\d\d", bullet), bullet
        assert re.search(r"\]\(docs/results\.md#[a-z0-9-]+\)", bullet), bullet


STUDY_SHAPE = ("**Question.**", "**Answer.**", "**What it cannot show.**", "```bash", "![")


def test_every_study_in_results_md_has_the_same_shape():
    text = (REPO / "docs" / "results.md").read_text(encoding="utf-8")
    studies = [s for s in re.split(r"\n## ", text)[1:] if "**Question.**" in s]
    names = {s.splitlines()[0] for s in studies}
    assert {"Post-LN vs Pre-LN vs RealFormer on Multi30k En->De", "A second language pair: Multi30k En->Fr",
            "Depth stress test: narrow deep models (6+6 and 12+12 layers)", "Learning-rate limit at 12+12 layers",
            "Which path matters (path ablation), seeds 1-2", "BERT-style encoders on WikiText-2 (masked LM)",
            "Learning-rate sweep, 200 updates (one seed)", "Attention analysis (the paper's Figs 4-8)",
            "Learning-rate limit at 6+6 layers (the paper's Fig. 3)"} <= names
    for study in studies:
        running = "Not known yet" in study  # a study still training: question, answer, command
        for part in (STUDY_SHAPE[:2] + ("```bash",) if running else STUDY_SHAPE):
            assert part in study, f"{study.splitlines()[0]}: no {part}"
        assert study.index("**Question.**") < study.index("**Answer.**")


def test_no_issue_numbers_in_the_readme_or_docs():
    for page, text in all_text():
        found = re.findall(r"(?i)\bissues?\s*#?\d+|(?<![\w/])#\d+\b", text)
        assert not found, f"{rel(page)} names issue numbers a reader cannot look up: {found}"


# --------------------------------------------------------------------------------------
# The first screen: what it is, whether it helps (in numbers no stronger than their
# intervals), the two commands with idle-machine timings; what to do without --user-dir
# --------------------------------------------------------------------------------------

FIRST_SCREEN = 30  # lines
NUMBER_WORDS = {3: "three", 4: "four", 5: "five", 6: "six", 7: "seven", 8: "eight", 9: "nine", 10: "ten"}


def seed_paired_summaries():
    """Every seed-paired summary ({"mean", "sd", "ci95", "seeds"}) of the committed results/*.json."""
    import json

    def walk(obj):
        if isinstance(obj, dict):
            if {"mean", "sd", "ci95"} <= set(obj):
                yield obj
            for value in obj.values():
                yield from walk(value)
        elif isinstance(obj, list):
            for value in obj:
                yield from walk(value)

    return [s for path in sorted((REPO / "results").glob("*.json"))
            for s in walk(json.loads(path.read_text(encoding="utf-8")))]


def headline():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    return text[text.index("<!-- headline"):text.index("<!-- /headline -->")]


def test_the_first_screen_says_what_it_is_whether_it_helps_and_the_two_commands_with_idle_timings():
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    first = "\n".join(lines[:FIRST_SCREEN])
    assert "plugin you load with `--user-dir`" in first and "`realformer_transformer`" in first
    assert "**Does it help?**" in first and "<!-- /headline -->" in first
    assert "make demo   #" in first and "make test   #" in first
    assert "On a quiet 2-core machine" in first and "set-up 60 s, `make demo` 53 s" in first
    assert "load 2" not in first  # busy-machine figures live in the docs


def _quoted(summary, digits):
    low, high = summary["ci95"]
    return (f"{summary['mean']:+.{digits}f} ± {summary['sd']:.{digits}f}", f"{low:+.{digits}f} to {high:+.{digits}f}")


def test_the_headline_quotes_the_committed_summaries_and_claims_no_more_than_their_intervals():
    """Three bullets: the paper's RealFormer on Post-LN first, residual attention on Pre-LN
    second, what the runs do not say third. Every "mean ± sd" (two decimals for BLEU, three
    for losses) is a committed seed-paired summary, quoted with its own 95% interval and the
    number of its seeds (all of them: a study's three seeds, not two); a bullet whose first
    interval holds zero claims no gain in its bold lead."""
    summaries = seed_paired_summaries()
    quoted = {}
    for s in summaries:
        for digits in (2, 3):
            pair, interval = _quoted(s, digits)
            quoted.setdefault(pair, []).append((interval, len(s["seeds"]), s["ci95"]))
    bullets = [line for line in headline().splitlines() if line.startswith("- ")]
    assert len(bullets) == 3, bullets
    # at most 170 words, and it ends with one sentence that says what a user should do
    text = headline()[headline().index("**Does it help?**"):]
    assert len(text.split()) <= 170, len(text.split())
    last = [line for line in text.splitlines() if line.strip()][-1]
    assert last.startswith("**What to do:** ") and last.endswith(".") and ". " not in last[:-1], last
    assert "Post-LN" in bullets[0].split("**")[1] and "paper" in bullets[0].split("**")[1], bullets[0]
    assert "Pre-LN Transformer" in bullets[1].split("**")[1], bullets[1]
    assert "does not say" in bullets[2].split("**")[1] and "paper's size" in bullets[2], bullets[2]
    for bullet in bullets:
        pairs = re.findall(r"[+-]\d+\.\d{2,3} ± \d+\.\d{2,3}", bullet)
        for pair in pairs:
            assert pair in quoted, f"{pair} is in no committed results/*.json: {bullet}"
            own = [interval in bullet and f"{NUMBER_WORDS[n]} seeds" in bullet for interval, n, _ in quoted[pair]]
            assert any(own), f"{pair} without its own 95% interval or its number of seeds: {bullet}"
        if not pairs:
            continue
        low, high = next(ci for interval, _, ci in quoted[pairs[0]] if interval in bullet)
        lead = bullet.split("**")[1]
        if low <= 0 <= high:  # an interval that holds zero claims nothing
            assert not re.search(r"\babout\b|\bgain|\bhelps?\b", lead), bullet
    gain = bullets[1]
    import json

    committed = json.loads((REPO / "results" / "multi30k_en_de.json").read_text())["realformer_preln"]
    paired = committed["seed_paired_vs_preln"]  # the headline's gain quotes every committed seed
    assert f"{paired['mean']:+.2f} ± {paired['sd']:.2f}" in gain, gain
    assert f"{NUMBER_WORDS[len(paired['seeds'])]} seeds" in gain, gain


def test_the_troubleshooting_box_quotes_what_fairseq_prints_without_the_plugin(tmp_path):
    """The two messages fairseq gives when --user-dir is forgotten, as fairseq (no plugin)
    prints them, and the README's fix."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    box = [line for line in text.splitlines() if line.startswith("> ")]
    assert len(box) == 4, box
    box = "\n".join(box)
    # what loads a checkpoint on torch >= 2.6: the launcher (no switch to export: the README names none)
    assert "`realformer-fairseq fairseq-generate ...`" in box and "`realformer-fairseq <command>`" in box
    assert "REALFORMER_NMT_FAIRSEQ_FIXES" not in text
    assert "`UnpicklingError: Weights only load failed`" in box and "`fairseq-generate`" in box
    assert "`argument --arch/-a: invalid choice: 'realformer_transformer'`" in box and "`fairseq-train`" in box
    assert "`--user-dir realformer_nmt`" in box and '`--user-dir "$(realformer-nmt-user-dir)"`' in box
    assert "weights_only=False" in box  # the advice torch prints, which the box says not to take
    code = f"""
import argparse, sys, torch
from fairseq import checkpoint_utils, options
torch.save({{"args": argparse.Namespace(arch="realformer_transformer"), "model": {{}}}}, {str(tmp_path / "c.pt")!r})
try:
    checkpoint_utils.load_checkpoint_to_cpu({str(tmp_path / "c.pt")!r})
except Exception as exc:
    print(type(exc).__name__ + ": " + str(exc).splitlines()[0])
assert "realformer_nmt" not in sys.modules
options.parse_args_and_arch(options.get_training_parser(), ["data", "--arch", "realformer_transformer"])
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stdout.startswith("UnpicklingError: Weights only load failed"), proc.stdout
    assert "argument --arch/-a: invalid choice: 'realformer_transformer'" in proc.stderr.splitlines()[-1]
    # the box's fix: --user-dir and the launcher's fixes (realformer_tools.launch, in process), and fairseq loads
    # it (weights only); the plugin alone does not, nor fairseq once the launcher has restored what it replaced
    fixed = f"""
import argparse, torch
from omegaconf import OmegaConf
from fairseq import checkpoint_utils, utils
path = {str(tmp_path / "cfg.pt")!r}  # as fairseq 0.12 saves one: args None, the config as omegaconf
torch.save({{"args": None, "cfg": OmegaConf.create({{"model": {{"arch": "realformer_transformer"}}}}), "model": {{}},
            "optimizer_history": [{{"criterion_name": "c", "optimizer_name": "o", "lr_scheduler_state": {{}},
                                    "num_updates": 0}}], "extra_state": {{"train_iterator": None}}}}, path)
utils.import_user_module(argparse.Namespace(user_dir={str(USER_DIR)!r}))
def load():
    try:
        return checkpoint_utils.load_checkpoint_to_cpu(path)["cfg"].model.arch
    except Exception as exc:
        return type(exc).__name__
from realformer_tools.launch import fixes_installed
print("plugin alone:", load())
with fixes_installed():
    print("launcher:", load())
print("after:", load())
"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REALFORMER_NMT_")}
    proc = subprocess.run([sys.executable, "-c", fixed], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines()[-3:] == ["plugin alone: UnpicklingError", "launcher: realformer_transformer",
                                             "after: UnpicklingError"], proc.stdout + proc.stderr[-2000:]
