"""Loading the plugin changes none of vanilla fairseq's numbers, and the launcher's fixes
change none unless asked to.

fairseq's own ``transformer`` (translation) and ``roberta`` (masked_lm, one DataLoader
worker) train 2 epochs on small synthetic corpora made here (sizes that are not multiples
of 8, where fairseq drops sentences) three ways: the plain ``fairseq-train``, the same with
``--user-dir realformer_nmt`` through the launcher (``python -m realformer_tools.launch``:
the fixes to fairseq 0.12), and that with ``--data-fixes``. Every JSON log line (train_inner,
train, valid) of the first two is the same (loss, nll_loss, wpb, bsz, update count, learning
rate, gradient norm); with the data fixes more sentences per epoch / new masks in epoch 2,
and the launcher says so.

What else a fairseq user runs, on one tiny ``transformer``, in three ways: fairseq alone,
with ``--user-dir realformer_nmt`` (plain console commands) and with the plugin through the
launcher: training that saves checkpoints with two DataLoader workers, resuming it for a
third epoch, ``fairseq-generate`` (float32 and ``--bf16``), ``fairseq-validate``, the hub
(``TransformerModel.from_pretrained``) and a mistyped ``--arch``. Without the fixes, fairseq
0.12 cannot load its own checkpoints under torch >= 2.6 (weights-only loading refuses
``argparse.Namespace``): the two plain runs load with torch's own
``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` (safe here: the checkpoints are the test's own).
fairseq alone runs in a process of its own (a process that never imported the plugin: the
isolation is the point); the plugin's and the launcher's runs run in the test process
(``inprocess.run_in_process``: the console command's function, ``fixes=False`` for the plain
command with ``--user-dir``, the launcher's ``main`` for the launcher), meanwhile. The typo's
three runs and the hub script keep processes of their own (fairseq's lists of choices are those
of a fresh process; the hub is a script a user runs).
Identical in all three: every log line, every checkpoint's weights, every hypothesis and
score, the validation loss, the hub's translations; ``fairseq-generate --bf16`` too, unless
the launcher is asked for ``--bf16-decoding`` (bfloat16 decoding; fairseq alone decodes in
float32); the typo's exit status and message are fairseq's with the plugin (less the
plugin's own names in fairseq's list of choices), one line through the launcher.
"""

import json
import random
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from conftest import BIN, USER_DIR, cli_env, trains
from inprocess import run_in_process

from realformer_tools.fairseq_fixes.safe_checkpoint_loading import fairseq_checkpoint_types

TIMING = {"wps", "ups", "wall", "train_wall", "gb_free"}  # wall-clock fields, not numbers of the run
ANNOUNCEMENT = re.compile(r"fairseq fixes: [^\n]*\bkeep_last_batch\b")  # the launcher's line, --data-fixes
SWITCHES = ("REALFORMER_NMT_DATA_FIXES", "REALFORMER_NMT_BF16_DECODING", "REALFORMER_NMT_CPU_BF16",
            "REALFORMER_NMT_FAIRSEQ_FIXES")
LAUNCHER = [sys.executable, "-m", "realformer_tools.launch"]


def _preprocess(raw, dest, *flags):
    """fairseq-preprocess (fairseq alone, in this process: the corpus, not what is compared)."""
    run_in_process("fairseq-preprocess", "--trainpref", raw / "train", "--validpref", raw / "valid", "--destdir",
                   dest, "--workers", "1", *flags, fixes=False)
    return dest


WORDS = [f"w{i}" for i in range(60)]


def _sentences(n, seed):
    """``n`` sentences of 3-14 words drawn with a Zipf-like skew (some words frequent, most rare)."""
    rng = random.Random(seed)
    weights = [1.0 / (i + 1) for i in range(len(WORDS))]
    return [" ".join(rng.choices(WORDS, weights, k=rng.randint(3, 14))) for _ in range(n)]


def _translation(sentence):
    """The synthetic target: the words reversed, each renamed (a task a transformer can learn)."""
    return " ".join("t" + w[1:] for w in reversed(sentence.split()))


SOURCE_SENTENCES = {"train": _sentences(203, seed=1), "valid": _sentences(21, seed=2)}


@pytest.fixture(scope="module")
def multi30k_words(tmp_path_factory):
    """203 training and 21 validation pairs of a synthetic translation corpus."""
    raw = tmp_path_factory.mktemp("pairs_raw")
    for split, sentences in SOURCE_SENTENCES.items():
        (raw / f"{split}.en").write_text("\n".join(sentences) + "\n")
        (raw / f"{split}.de").write_text("\n".join(map(_translation, sentences)) + "\n")
    return _preprocess(raw, tmp_path_factory.mktemp("pairs_bin"), "--source-lang", "en", "--target-lang", "de",
                       "--joined-dictionary")


@pytest.fixture(scope="module")
def wikitext_lines(tmp_path_factory):
    """131 training and 29 validation lines of synthetic text."""
    raw = tmp_path_factory.mktemp("text_raw")
    (raw / "train").write_text("\n".join(_sentences(131, seed=3)) + "\n")
    (raw / "valid").write_text("\n".join(_sentences(29, seed=4)) + "\n")
    return _preprocess(raw, tmp_path_factory.mktemp("text_bin"), "--only-source")


TRANSFORMER = ["--arch", "transformer", "--encoder-layers", "1", "--decoder-layers", "1",
               "--encoder-embed-dim", "16", "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32",
               "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2", "--decoder-attention-heads", "2",
               "--share-all-embeddings", "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
               "--max-tokens", "600"]
ROBERTA = ["--task", "masked_lm", "--criterion", "masked_lm", "--arch", "roberta", "--encoder-layers", "1",
           "--encoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2",
           "--tokens-per-sample", "32", "--batch-size", "4", "--num-workers", "1"]
COMMON = ["--optimizer", "adam", "--lr", "1e-3", "--cpu", "--max-epoch", "2", "--seed", "1", "--no-save",
          "--log-format", "json", "--log-interval", "5"]


def _start(data, flags, save_dir):
    """fairseq-train alone, in a process that never imports the plugin."""
    args = [str(data), *flags, *COMMON, "--save-dir", str(save_dir)]
    return subprocess.Popen([str(BIN / "fairseq-train"), *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=_switched())


def _launched(data, flags, save_dir, data_fixes):
    """The same with the plugin through the launcher (and its data fixes), in this process."""
    args = [str(data), *flags, *COMMON, "--save-dir", str(save_dir), "--user-dir", USER_DIR]
    with _unswitched():
        proc = run_in_process("fairseq-train", *args, check=False, data_fixes=data_fixes)
    return proc


def _records(output):
    """The JSON records of a ``--log-format json`` log: ``(kind, {field: value})`` in order."""
    records = []
    for line in output.splitlines():
        for kind in ("train_inner", "train", "valid"):
            marker = f" | {kind} | "
            if marker in line and line.split(marker, 1)[1].startswith("{"):
                fields = json.loads(line.split(marker, 1)[1])
                records.append((kind, {k: v for k, v in fields.items()
                                       if k.split("_", 1)[-1] not in TIMING and k not in TIMING}))
    return records


def _train_three(data, flags, tmp_path):
    """Logs of fairseq alone, with the plugin through the launcher, and that with its data fixes."""
    alone = _start(data, flags, tmp_path / "alone")
    launched = {name: _launched(data, flags, tmp_path / name, data_fixes)
                for name, data_fixes in (("plugin", False), ("fixed", True))}
    stdout, _ = alone.communicate(timeout=600)
    assert alone.returncode == 0, f"alone:\n{stdout[-3000:]}"
    out = {"alone": stdout}
    for name, proc in launched.items():
        assert proc.returncode == 0, f"{name}:\n{proc.stderr[-3000:]}"
        out[name] = proc.stdout + proc.stderr
    return out


def _field(records, kind, name):
    return [float(r[f"{kind}_{name}" if kind != "train_inner" else name]) for k, r in records if k == kind]


def _assert_identical(logs, *fields):
    alone, plugin = _records(logs["alone"]), _records(logs["plugin"])
    kinds = [k for k, _ in alone]
    assert {"train_inner", "train", "valid"} <= set(kinds) and kinds.count("train") == 2, kinds
    assert alone == plugin  # every field of every line, in order
    for kind, record in alone:
        prefix = "" if kind == "train_inner" else f"{kind}_"
        for name in fields:
            assert prefix + name in record, (kind, name, record)
    assert not ANNOUNCEMENT.search(logs["plugin"]) and not ANNOUNCEMENT.search(logs["alone"])
    assert len(ANNOUNCEMENT.findall(logs["fixed"])) == 1


@pytest.mark.slow
def test_transformer_numbers_are_fairseqs_with_the_plugin_loaded(multi30k_words, tmp_path):
    logs = _train_three(multi30k_words, TRANSFORMER, tmp_path)
    _assert_identical(logs, "loss", "nll_loss", "wpb", "bsz", "num_updates")
    # asked for, the kept last batch acts: every epoch trains (and validates) on all sentences
    alone, fixed = _records(logs["alone"]), _records(logs["fixed"])
    assert _field(fixed, "train", "num_updates")[-1] > _field(alone, "train", "num_updates")[-1]
    assert _field(fixed, "valid", "loss") != _field(alone, "valid", "loss")


@pytest.mark.slow
def test_roberta_numbers_are_fairseqs_with_the_plugin_loaded(wikitext_lines, tmp_path):
    logs = _train_three(wikitext_lines, ROBERTA, tmp_path)
    _assert_identical(logs, "loss", "wpb", "bsz", "num_updates")
    alone, fixed = _records(logs["alone"]), _records(logs["fixed"])
    assert _field(fixed, "train", "loss") != _field(alone, "train", "loss")


def _switched(**values):
    """The tests' environment with the switches as given (unset otherwise)."""
    env = cli_env()
    for name in SWITCHES:
        env.pop(name, None)
    env.update(values)
    return env


class _unswitched:
    """This process's environment without the switches and torch's weights-only switches while
    a run in process starts (``run_in_process`` puts back what it found): as ``_switched``."""

    def __init__(self, **values):
        self.values = values

    def __enter__(self):
        import os

        self.saved = {k: os.environ.pop(k) for k in (*SWITCHES, "TORCH_FORCE_WEIGHTS_ONLY_LOAD", TORCH_UNSAFE)
                      if k in os.environ}
        os.environ.update(self.values)

    def __exit__(self, *exc):
        import os

        for k in (*SWITCHES, "TORCH_FORCE_WEIGHTS_ONLY_LOAD", TORCH_UNSAFE):
            os.environ.pop(k, None)
        os.environ.update(self.saved)


def test_no_switch_makes_the_plugin_install_a_fix():
    """A fresh ``import realformer_nmt`` with every switch the launcher reads (and the one the
    plugin read before) set to 1: fairseq's batching, epoch iterator and checkpoint loader
    are fairseq's own."""
    probe = ("import realformer_nmt; from fairseq import checkpoint_utils; from fairseq.data import data_utils, "
             "iterators; print(getattr(data_utils.batch_by_size, '__realformer_fixed__', False), "
             "getattr(iterators.EpochBatchIterator.next_epoch_itr, '__realformer_fixed__', False), "
             "getattr(checkpoint_utils.load_checkpoint_to_cpu, '__realformer_safe__', False))")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=600,
                          env=_switched(**{name: "1" for name in SWITCHES}))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["False", "False", "False"]


# --------------------------------------------------------------------------------------
# What else a fairseq user runs: save and resume, generate, validate, the hub, the typo
# --------------------------------------------------------------------------------------

FLAVOURS = ("alone", "plugin", "fixes")  # fairseq alone, + --user-dir, + the launcher
TINY = [*TRANSFORMER[:-2], "--max-tokens", "300", "--optimizer", "adam", "--lr", "1e-3", "--cpu", "--seed", "1",
        "--log-format", "json", "--log-interval", "5", "--num-workers", "2", "--no-epoch-checkpoints"]
SHORT = ["--max-len-a", "0", "--max-len-b", "10"]  # hypotheses' length is not what these tests compare
TORCH_UNSAFE = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"  # torch's own switch, for vanilla fairseq 0.12 (module docstring)
HUB = """
import contextlib, sys
if sys.argv[1] != "alone":
    import realformer_nmt  # noqa: F401  (what --user-dir does)
from fairseq.models.transformer import TransformerModel
if sys.argv[1] == "fixes":
    from realformer_tools.launch import fixes_installed
    fixes = contextlib.ExitStack()  # kept: the fixes stay for the script
    fixes.enter_context(fixes_installed())

hub = TransformerModel.from_pretrained(sys.argv[2], checkpoint_file="checkpoint_last.pt", data_name_or_path=sys.argv[3])
for line in sys.argv[4:]:
    best = hub.generate(hub.encode(line), beam=2, max_len_a=0, max_len_b=10)[0]
    print(hub.decode(best["tokens"]), "|", float(best["score"]))
"""


def _flavour_env(flavour):
    env = _switched()
    env.pop("TORCH_FORCE_WEIGHTS_ONLY_LOAD", None)
    if flavour != "fixes":
        env[TORCH_UNSAFE] = "1"
    return env


def _cmd(tool, flavour, *args, launcher_flags=()):
    cmd = [*LAUNCHER, *launcher_flags, tool] if flavour == "fixes" else [str(BIN / tool)]
    return cmd + [*map(str, args)] + (["--user-dir", USER_DIR] if flavour != "alone" else [])


def _in_process(tool, flavour, *args, launcher_flags=()):
    """``tool`` with ``--user-dir`` in this process: the plain console command (``plugin``: no fix,
    torch's own switch as the plain process has it) or through the launcher (``fixes``)."""
    args = [*map(str, args), "--user-dir", USER_DIR]
    if flavour == "plugin":
        with _unswitched(**{TORCH_UNSAFE: "1"}):
            return run_in_process(tool, *args, check=False, fixes=False)
    with _unswitched():
        return run_in_process(tool, *args, check=False, bf16_decoding="--bf16-decoding" in launcher_flags)


def _meanwhile(commands, logs, in_process):
    """``_run_all(commands)`` in a thread while ``{key: function}`` runs here, one after another;
    both answers in one ``{key: CompletedProcess}``."""
    with ThreadPoolExecutor(1) as pool:
        started = pool.submit(_run_all, commands, logs)
        done = {key: run() for key, run in in_process.items()}
        done.update(started.result())
    return done


def _run_all(commands, logs, limit=4):
    """Run ``{key: (cmd, env)}``, ``limit`` at a time, output to files in ``logs``;
    ``{key: CompletedProcess}``."""
    pending, running, done = list(commands.items()), {}, {}
    while pending or running:
        while pending and len(running) < limit:
            key, (cmd, env) = pending.pop(0)
            name = "-".join(key)
            with open(logs / f"{name}.out", "w") as out, open(logs / f"{name}.err", "w") as err:
                running[key] = (subprocess.Popen([str(c) for c in cmd], stdout=out, stderr=err, env=env), name)
        for key, (proc, name) in list(running.items()):
            if proc.poll() is not None:
                done[key] = subprocess.CompletedProcess(proc.args, proc.returncode, (logs / f"{name}.out").read_text(),
                                                        (logs / f"{name}.err").read_text())
                del running[key]
        time.sleep(0.2)
    return done


@pytest.fixture(scope="module")
@trains
def user_runs(multi30k_words, tmp_path_factory):
    """``{(what, flavour): CompletedProcess}`` and the save dirs, for every flavour."""
    work = tmp_path_factory.mktemp("user_runs")
    # fairseq alone and the typos in processes of their own; the plugin's and the launcher's
    # runs in this process meanwhile
    train = {("train", "alone"): (_cmd("fairseq-train", "alone", multi30k_words, *TINY, "--max-epoch", 2,
                                       "--save-dir", work / "alone"), _flavour_env("alone"))}
    train.update({("typo", f): (_cmd("fairseq-train", f, multi30k_words, *TINY, "--arch", "transfomer",
                                     "--save-dir", work / f"typo-{f}"), _flavour_env(f)) for f in FLAVOURS})
    runs = _meanwhile(train, work, {("train", f): lambda f=f: _in_process(
        "fairseq-train", f, multi30k_words, *TINY, "--max-epoch", 2, "--save-dir", work / f) for f in FLAVOURS[1:]})
    for f in FLAVOURS:
        assert runs["train", f].returncode == 0, runs["train", f].stderr[-3000:]
        shutil.copytree(work / f, work / f"resume-{f}")
    sentences = SOURCE_SENTENCES["valid"][:4]
    later, here = {}, {}
    for f in FLAVOURS:
        checkpoint = work / f / "checkpoint_last.pt"
        # every sentence in every flavour (the launcher's scoring commands keep the last len % 8 always;
        # fairseq alone with --required-batch-size-multiple 1): the same sentences, compared
        # at most 10 tokens a hypothesis: the model, 2 epochs old, would otherwise repeat one word to
        # fairseq's limit (200) in every sentence; what is compared is the same either way
        decode = ["--path", checkpoint, "--gen-subset", "valid", "--beam", "2", "--batch-size", "8", "--cpu",
                  "--required-batch-size-multiple", "1", *SHORT]
        tools = {("resume", f): ("fairseq-train", [multi30k_words, *TINY, "--max-epoch", 3, "--save-dir",
                                                   work / f"resume-{f}"]),
                 ("generate", f): ("fairseq-generate", [multi30k_words, *decode]),
                 ("generate-bf16", f): ("fairseq-generate", [multi30k_words, *decode, "--bf16"]),
                 ("validate", f): ("fairseq-validate", [multi30k_words, "--task", "translation", "--path", checkpoint,
                                                        "--valid-subset", "valid", "--batch-size", "8", "--cpu",
                                                        "--required-batch-size-multiple", "1"])}
        if f == "fixes":
            tools["generate-bf16", "bf16-decoding"] = ("fairseq-generate", [multi30k_words, *decode, "--bf16"])
        for key, (tool, args) in tools.items():
            flags = ["--bf16-decoding"] if key[1] == "bf16-decoding" else []
            if f == "alone":
                later[key] = (_cmd(tool, f, *args), _flavour_env(f))
            else:  # the plugin's and the launcher's tools: in this process
                here[key] = lambda tool=tool, f=f, args=args, flags=flags: _in_process(tool, f, *args,
                                                                                       launcher_flags=flags)
        later["hub", f] = ([sys.executable, "-c", HUB, f, work / f,
                            multi30k_words, *sentences], _flavour_env(f))
    runs.update(_meanwhile(later, work, here))
    return runs, work


def _ok(runs, what):
    for f in FLAVOURS:
        assert runs[what, f].returncode == 0, f"{what} {f}:\n{runs[what, f].stderr[-3000:]}"


def _hypotheses(proc):
    """fairseq-generate's per-sentence lines (S, T, H, D, P) and its BLEU line."""
    lines = sorted(line for line in proc.stdout.splitlines() if re.match(r"[STHDP]-\d+\t", line))
    bleu = [line.split("Generate valid with beam=2: ", 1)[1] for line in (proc.stdout + proc.stderr).splitlines()
            if "Generate valid with beam=2: " in line]
    assert lines and bleu, proc.stdout[-2000:] + proc.stderr[-2000:]
    return lines, bleu


@pytest.mark.slow
def test_saved_checkpoints_and_resumed_training_are_fairseqs(user_runs):
    runs, work = user_runs
    _ok(runs, "train")
    _ok(runs, "resume")
    logs = {f: _records(runs["train", f].stdout + runs["train", f].stderr) for f in FLAVOURS}
    resumed = {f: _records(runs["resume", f].stdout + runs["resume", f].stderr) for f in FLAVOURS}
    assert [k for k, _ in logs["alone"]].count("train") == 2 and [k for k, _ in resumed["alone"]].count("train") == 1
    assert logs["alone"] == logs["plugin"] == logs["fixes"]
    assert resumed["alone"] == resumed["plugin"] == resumed["fixes"]
    for f in FLAVOURS:
        assert "Loaded checkpoint" in runs["resume", f].stdout + runs["resume", f].stderr
    with fairseq_checkpoint_types():
        weights = {f: torch.load(work / f / "checkpoint_last.pt", map_location="cpu")["model"] for f in FLAVOURS}
    for f in ("plugin", "fixes"):
        assert weights[f].keys() == weights["alone"].keys()
        assert all(torch.equal(weights[f][k], weights["alone"][k]) for k in weights["alone"])


@pytest.mark.slow
def test_generate_validate_and_the_hub_are_fairseqs(user_runs):
    runs, _ = user_runs
    for what in ("generate", "validate", "hub"):
        _ok(runs, what)
    generated = {f: _hypotheses(runs["generate", f]) for f in FLAVOURS}
    assert generated["alone"] == generated["plugin"] == generated["fixes"]
    valid = {f: re.findall(r"valid on 'valid' subset \| loss ([\d.]+) \| nll_loss ([\d.]+) \| ppl ([\d.]+)",
                           runs["validate", f].stdout + runs["validate", f].stderr) for f in FLAVOURS}
    assert valid["alone"] and valid["alone"] == valid["plugin"] == valid["fixes"]
    hub = {f: runs["hub", f].stdout.strip().splitlines() for f in FLAVOURS}
    assert len(hub["alone"]) == 4 and hub["alone"] == hub["plugin"] == hub["fixes"]


@pytest.mark.slow
def test_generate_bf16_is_fairseqs_unless_bf16_decoding_is_asked_for(user_runs):
    """fairseq 0.12 alone ignores ``--bf16`` when decoding (float32); the plugin and the
    launcher's default fixes change nothing; the launcher's ``--bf16-decoding`` decodes in
    bfloat16, which changes the scores: the user's choice."""
    runs, _ = user_runs
    _ok(runs, "generate-bf16")
    bf16 = {f: _hypotheses(runs["generate-bf16", f]) for f in FLAVOURS}
    assert bf16["alone"] == bf16["plugin"] == bf16["fixes"] == _hypotheses(runs["generate", "alone"])
    asked = runs["generate-bf16", "bf16-decoding"]
    assert asked.returncode == 0, asked.stderr[-3000:]
    assert _hypotheses(asked) != bf16["alone"]
    assert "casting TransformerModel to bfloat16" in asked.stdout + asked.stderr


@pytest.mark.slow
def test_a_mistyped_arch_gets_fairseqs_own_answer_unless_launched(user_runs):
    runs, _ = user_runs
    alone, plugin, fixes = (runs["typo", f] for f in FLAVOURS)
    assert alone.returncode == plugin.returncode == 2
    assert "invalid choice: 'transfomer'" in alone.stderr and len(alone.stderr.splitlines()) > 50
    # the same usage and message, word for word, but for the names the plugin registered in
    # fairseq's lists of choices (its architectures, criterions and --bpe wordpiece)
    registered = re.compile(r",(?:masked_lm_acc|masked_lm_nsp|wordpiece|realformer_\w+)(?=[,}])"
                            r"|(?<=[{,])realformer_\w+,|, 'realformer_\w+'")
    assert registered.search(plugin.stderr)
    assert registered.sub("", plugin.stderr) == alone.stderr
    assert fixes.returncode == 2  # a usage error, as argparse's
    ours = [line for line in fixes.stderr.splitlines() if line.strip()]
    assert ours[-1].startswith("realformer_nmt: error: --arch 'transfomer' is not a registered architecture")
    assert "usage:" not in fixes.stderr
