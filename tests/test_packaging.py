"""The package as a user gets it: a wheel built from this checkout, installed with
``pip install --no-deps --target`` into a folder outside the checkout, used from a working
directory outside it. Its console commands answer ``--help``, ``realformer-nmt-user-dir``
names the installed plugin, ``fairseq-train --user-dir <that>`` trains, and the CUDA rule of
``--residual-attention-kernel auto`` is read from the package (then the user's own rule,
then ``REALFORMER_KERNEL_RULE``), not from a ``results/`` folder next to site-packages.

Also here: the precedence of the rule files, in-process."""

import configparser
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import BIN, REPO

import realformer_nmt.modules.residual_attention as ra

# the rule the test wheel ships (the checkout's results/gpu/kernel_rule.json, replaced in
# the copy the wheel is built from, so that the test knows what the package must hold)
PACKAGED_RULE = {"device": "packaging test GPU", "dtype": "float16",
                 "rule": {"first_layer": "fused", "later_layers": "materialized"}}
USER_RULE = {"device": "user's GPU", "rule": {"first_layer": "bias", "later_layers": "fused"}}
ENV_RULE = {"device": "named GPU", "rule": {"first_layer": "materialized", "later_layers": "bias"}}


def _copy_sources(dest):
    """What a fresh clone has that a build reads (no build/, egg-info or caches)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in ("setup.py", "README.md", "LICENSE", "CITATION.cff", "MANIFEST.in", "constraints.txt"):
        shutil.copy2(REPO / name, dest / name)
    for package in ("realformer_nmt", "realformer_tools"):
        shutil.copytree(REPO / package, dest / package, ignore=ignore)
    (dest / "results" / "gpu").mkdir(parents=True)
    (dest / "results" / "gpu" / "kernel_rule.json").write_text(json.dumps(PACKAGED_RULE))


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(target, env, cwd, wheel): the wheel installed into ``target``; ``env`` puts only
    ``target`` and the venv's site-packages on the path; ``cwd`` is an empty folder."""
    root = tmp_path_factory.mktemp("wheel")
    src, dist, target, cwd = root / "src", root / "dist", root / "target", root / "cwd"
    for d in (src, dist, cwd):
        d.mkdir()
    _copy_sources(src)
    env = dict(os.environ, PIP_CONSTRAINT=str(REPO / "constraints.txt"), PIP_NO_INPUT="1",
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    env.pop("PYTHONPATH", None)
    pip = [sys.executable, "-m", "pip"]
    # no build isolation: the venv's setuptools builds it, offline
    subprocess.run(pip + ["wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(dist), str(src)],
                   cwd=root, env=env, check=True, capture_output=True, timeout=600)
    (wheel,) = dist.glob("realformer_nmt-*.whl")
    subprocess.run(pip + ["install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   cwd=root, env=env, check=True, capture_output=True, timeout=600)
    run_env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(target), sysconfig.get_paths()["purelib"]]),
                   OMP_NUM_THREADS="1", XDG_CACHE_HOME=str(root / "empty_cache"))
    run_env.pop(ra.KERNEL_RULE_ENV, None)
    return target, run_env, cwd, wheel


def _console_scripts(wheel):
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt"))
        parser = configparser.ConfigParser()
        parser.read_string(z.read(name).decode())
        files = set(z.namelist())
    return dict(parser["console_scripts"]), files


def test_every_script_is_a_console_command_of_the_wheel(installed):
    """Each scripts/<name>.py of the checkout has a command in the wheel that runs the
    same function (realformer_tools.cli.<name>), and there is a --user-dir command."""
    _, _, _, wheel = installed
    commands, files = _console_scripts(wheel)
    targets = {target.split(":")[0] for target in commands.values()}
    scripts = sorted(p.stem for p in (REPO / "scripts").glob("*.py") if not p.stem.startswith("_"))
    assert scripts
    missing = [s for s in scripts if f"realformer_tools.cli.{s}" not in targets]
    assert not missing, f"scripts with no console command in the wheel: {missing}"
    assert commands["realformer-nmt-user-dir"] == "realformer_tools.cli.user_dir:main"
    assert commands["realformer-export-hf"] == "realformer_tools.cli.export_hf:main"
    assert not any(f.startswith(("scripts/", "tests/", "results/")) for f in files)
    assert "realformer_nmt/modules/kernel_rule.json" in files


def test_wheel_requires_fairseq_alone_and_the_tools_extra_the_rest(installed):
    """``pip install realformer-nmt`` is the plugin (fairseq-fixed, and torch the user has);
    ``[tools]`` adds what the commands import; both packages are in the one wheel."""
    _, _, _, wheel = installed
    with zipfile.ZipFile(wheel) as z:
        files = set(z.namelist())
        metadata = z.read(next(n for n in files if n.endswith(".dist-info/METADATA"))).decode()
    requires = [line.split(":", 1)[1].strip() for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert [r for r in requires if "extra ==" not in r] == ["fairseq-fixed==0.12.3.1"]
    tools = {r.split(";")[0].strip() for r in requires if 'extra == "tools"' in r}
    for name in ("sentencepiece", "sacrebleu", "scipy", "sacremoses", "subword-nmt", "tensorboardX", "matplotlib"):
        assert any(t.startswith(name) for t in tools), (name, tools)
    assert "realformer_nmt/__init__.py" in files and "realformer_tools/cli/run_demo.py" in files
    assert "realformer_tools/hf/modeling/modeling_realformer.py" in files


def _help(target, env, cwd, command):
    proc = subprocess.run([str(target / "bin" / command), "--help"], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)
    return command, proc


def test_console_commands_answer_help_outside_the_checkout(installed):
    target, env, cwd, wheel = installed
    commands, files = _console_scripts(wheel)
    with ThreadPoolExecutor(max_workers=3) as pool:
        results = list(pool.map(lambda c: _help(target, env, cwd, c), sorted(commands)))
    has_hf_export = "realformer_tools/hf/hf_export.py" in files
    problems = []
    for command, proc in results:
        if command == "realformer-export-hf" and not has_hf_export:
            # the export itself is not in this wheel yet: one line saying so
            if proc.returncode != 1 or proc.stderr.strip().count("\n") != 0 or "hf_export" not in proc.stderr:
                problems.append(f"{command}: {proc.returncode} {proc.stderr[-500:]}")
            continue
        if proc.returncode != 0 or not proc.stdout.startswith("usage: " + command):
            problems.append(f"{command}: exit {proc.returncode}\n{proc.stdout[:200]}{proc.stderr[-1500:]}")
    assert not problems, "\n".join(problems)
    assert not any(cwd.iterdir())  # --help wrote nothing


def test_user_dir_command_names_the_installed_package(installed):
    target, env, cwd, _ = installed
    printed = subprocess.run([str(target / "bin" / "realformer-nmt-user-dir")], cwd=cwd, env=env,
                             capture_output=True, text=True, check=True, timeout=120).stdout.strip()
    assert Path(printed) == target / "realformer_nmt"
    # and that is the copy Python imports there (not the checkout's, not an editable install's)
    imported = subprocess.run([sys.executable, "-c", "import realformer_nmt; print(realformer_nmt.__file__)"],
                              cwd=cwd, env=env, capture_output=True, text=True, check=True, timeout=300)
    assert Path(imported.stdout.strip()) == target / "realformer_nmt" / "__init__.py"


RULE_PROBE = r"""
import json, logging, os, sys
records = []
class Keep(logging.Handler):
    def emit(self, record):
        records.append(record.getMessage())
import realformer_nmt.modules.residual_attention as ra
logger = logging.getLogger(ra.__name__)
logger.addHandler(Keep()); logger.setLevel(logging.INFO)
out = {"module": ra.__file__, "steps": []}
for step in json.loads(sys.argv[1]):
    for key, value in step.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    before = len(records)
    rule = ra.cuda_kernel_rule()
    ra.cuda_kernel_rule()  # logged once
    out["steps"].append({"rule": rule, "source": ra.kernel_rule_source(), "logs": records[before:]})
print(json.dumps(out))
"""


def test_installed_package_reads_its_packaged_rule_then_the_users_then_the_named_one(installed, tmp_path):
    target, env, cwd, _ = installed
    user_cache = tmp_path / "cache"
    (user_cache / "realformer_nmt").mkdir(parents=True)
    named = tmp_path / "named_rule.json"
    named.write_text(json.dumps(ENV_RULE))
    steps = [
        {},                                                    # nothing of the user's: the packaged rule
        {"XDG_CACHE_HOME": str(user_cache)},                   # the user's rule (written below)
        {ra.KERNEL_RULE_ENV: str(named)},                      # the named file wins over both
    ]
    (user_cache / "realformer_nmt" / "kernel_rule.json").write_text(json.dumps(USER_RULE))
    proc = subprocess.run([sys.executable, "-c", RULE_PROBE, json.dumps(steps)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert Path(out["module"]).parent == target / "realformer_nmt" / "modules" / "residual_attention"
    packaged, user, named_step = out["steps"]
    assert packaged["rule"] == PACKAGED_RULE["rule"]
    assert packaged["source"] == [str(target / "realformer_nmt" / "modules" / "kernel_rule.json"),
                                  "the packaged rule"]
    assert user["rule"] == USER_RULE["rule"]
    assert user["source"] == [str(user_cache / "realformer_nmt" / "kernel_rule.json"), "the user's rule"]
    assert named_step["rule"] == ENV_RULE["rule"]
    assert named_step["source"] == [str(named), ra.KERNEL_RULE_ENV]
    for step, device, which in ((packaged, "packaging test GPU", "the packaged rule"),
                                (user, "user's GPU", "the user's rule"), (named_step, "named GPU", ra.KERNEL_RULE_ENV)):
        assert len(step["logs"]) == 1, step["logs"]
        assert device in step["logs"][0] and which in step["logs"][0]


# --------------------------------------------------------------------------------------
# The order of the rule files, in-process (no wheel)
# --------------------------------------------------------------------------------------

@pytest.fixture
def rule_places(tmp_path, monkeypatch):
    places = {"packaged": tmp_path / "pkg" / "kernel_rule.json", "checkout": tmp_path / "repo" / "kernel_rule.json",
              "user": tmp_path / "cache" / "realformer_nmt" / "kernel_rule.json"}
    for path in places.values():
        path.parent.mkdir(parents=True)
    monkeypatch.setattr(ra.choice, "PACKAGED_KERNEL_RULE", str(places["packaged"]))
    monkeypatch.setattr(ra.choice, "CHECKOUT_KERNEL_RULE", str(places["checkout"]))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(ra.KERNEL_RULE_ENV, raising=False)
    ra.choice._read_kernel_rule.cache_clear()
    yield places
    ra.choice._read_kernel_rule.cache_clear()


def test_user_rule_path_follows_xdg_cache_home(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert ra.user_kernel_rule_path() == str(tmp_path / "realformer_nmt" / "kernel_rule.json")
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert ra.user_kernel_rule_path() == str(tmp_path / "home" / ".cache" / "realformer_nmt" / "kernel_rule.json")


def test_no_rule_anywhere_is_the_bias_default(rule_places):
    path, which = ra.kernel_rule_source()
    assert which == "no rule file" and not os.path.exists(path)
    assert ra.cuda_kernel_rule() == {"first_layer": "bias", "later_layers": "bias"}


def test_rule_files_in_order_checkout_packaged_user(rule_places):
    rules = {name: {"device": name, "rule": {"first_layer": k1, "later_layers": k2}}
             for name, k1, k2 in (("checkout", "fused", "fused"), ("packaged", "materialized", "fused"),
                                  ("user", "bias", "materialized"))}
    expected = {"checkout": "the checkout's rule", "packaged": "the packaged rule", "user": "the user's rule"}
    for name in ("checkout", "packaged", "user"):  # each one added shadows the ones before
        rule_places[name].write_text(json.dumps(rules[name]))
        assert ra.kernel_rule_source() == (str(rule_places[name]), expected[name])
        assert ra.cuda_kernel_rule() == rules[name]["rule"]


# --------------------------------------------------------------------------------------
# fairseq-train with the installed plugin
# --------------------------------------------------------------------------------------

@pytest.mark.slow
def test_fairseq_train_with_the_installed_user_dir(installed, data_bin, tmp_path):
    from cli_helpers import TINY_FLAGS

    target, env, cwd, _ = installed
    user_dir = subprocess.run([str(target / "bin" / "realformer-nmt-user-dir")], cwd=cwd, env=env,
                              capture_output=True, text=True, check=True, timeout=120).stdout.strip()
    save = tmp_path / "ckpt"
    proc = subprocess.run(
        [str(BIN / "fairseq-train"), str(data_bin), "--user-dir", user_dir, "--arch", "realformer_transformer",
         "--residual-attention-paths", "encoder,decoder,cross", "--max-update", "5", "--save-dir", str(save),
         *TINY_FLAGS], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    from fairseq import checkpoint_utils

    state = checkpoint_utils.load_checkpoint_to_cpu(str(save / "checkpoint_last.pt"))
    assert state["optimizer_history"][-1]["num_updates"] == 5
    assert state["cfg"]["model"].arch == "realformer_transformer"
