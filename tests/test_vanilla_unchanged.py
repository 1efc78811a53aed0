"""Loading the plugin changes none of vanilla fairseq's numbers unless asked to.

fairseq's own ``transformer`` (translation, Multi30k words) and ``roberta`` (masked_lm,
WikiText-2, one DataLoader worker) train 2 epochs through the real ``fairseq-train``,
without and with ``--user-dir realformer_nmt``: with ``REALFORMER_NMT_DATA_FIXES`` off,
every JSON log line (train_inner, train, valid) has the same loss, nll_loss, wpb, bsz,
update count, learning rate and gradient norm. The always-on fixes are installed in the
runs with the plugin, so this also shows that they change no number. With the switch on,
the data fixes do act (more sentences per epoch, new masks in epoch 2) and the log says
so once. The corpora are cut to sizes that are not multiples of 8, where fairseq drops
sentences.
"""

import gzip
import json
import subprocess
import sys

import pytest
from conftest import BIN, MULTI30K, USER_DIR, WIKITEXT2, cli_env, require_shared_data

from realformer_tools.fairseq_fixes import SWITCH

TIMING = {"wps", "ups", "wall", "train_wall", "gb_free"}  # wall-clock fields, not numbers of the run
ANNOUNCEMENT = f"{SWITCH}=1: fairseq's data handling fixed"


def _preprocess(raw, dest, *flags):
    proc = subprocess.run([str(BIN / "fairseq-preprocess"), "--trainpref", raw / "train", "--validpref",
                           raw / "valid", "--destdir", dest, "--workers", "1", *flags],
                          capture_output=True, text=True, env=cli_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return dest


def _head(path, n, skip=0, keep=lambda line: True):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        lines = [line.strip() for line in f if keep(line.strip())]
    return lines[skip:skip + n]


@pytest.fixture(scope="module")
def multi30k_words(tmp_path_factory):
    """203 training and 21 validation pairs of Multi30k En-De, whitespace words."""
    require_shared_data(MULTI30K)
    raw = tmp_path_factory.mktemp("m30k_raw")
    for split, name, n in (("train", "train", 203), ("valid", "val", 21)):
        for lang in ("en", "de"):
            (raw / f"{split}.{lang}").write_text("\n".join(_head(MULTI30K / f"{name}.{lang}.gz", n)) + "\n")
    return _preprocess(raw, tmp_path_factory.mktemp("m30k_bin"), "--source-lang", "en", "--target-lang", "de",
                       "--joined-dictionary")


@pytest.fixture(scope="module")
def wikitext_lines(tmp_path_factory):
    """131 training and 29 validation lines of WikiText-2 (non-empty, not headings)."""
    require_shared_data(WIKITEXT2)
    raw = tmp_path_factory.mktemp("wt2_raw")
    text = _head(WIKITEXT2 / "valid.txt", 160, keep=lambda line: line and not line.startswith("="))
    (raw / "train").write_text("\n".join(text[:131]) + "\n")
    (raw / "valid").write_text("\n".join(text[131:]) + "\n")
    return _preprocess(raw, tmp_path_factory.mktemp("wt2_bin"), "--only-source")


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


def _start(data, flags, save_dir, plugin, switch):
    cmd = [str(BIN / "fairseq-train"), str(data), *flags, *COMMON, "--save-dir", str(save_dir)]
    cmd += ["--user-dir", USER_DIR] if plugin else []
    env = dict(cli_env(), **{SWITCH: switch})
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


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
    """Logs of fairseq alone, with the plugin (switch off) and with the plugin (switch on)."""
    runs = {name: _start(data, flags, tmp_path / name, plugin, switch)
            for name, plugin, switch in (("alone", False, "0"), ("plugin", True, "0"), ("fixed", True, "1"))}
    out = {}
    for name, proc in runs.items():
        stdout, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"{name}:\n{stdout[-3000:]}"
        out[name] = stdout
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
    assert ANNOUNCEMENT not in logs["plugin"] and ANNOUNCEMENT not in logs["alone"]
    assert logs["fixed"].count(ANNOUNCEMENT) == 1


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


def test_the_data_fixes_are_off_unless_asked_for(tmp_path):
    """A fresh ``import realformer_nmt``: fairseq's batching and epoch iterator untouched
    with the switch unset or 0, replaced with it 1; another value is one line."""
    probe = ("import realformer_nmt; from fairseq.data import data_utils, iterators; "
             "print(getattr(data_utils.batch_by_size, '__realformer_fixed__', False), "
             "getattr(iterators.EpochBatchIterator.next_epoch_itr, '__realformer_fixed__', False))")
    for value, expected in ((None, "False False"), ("0", "False False"), ("1", "True True")):
        env = cli_env()
        env.pop(SWITCH, None)
        if value is not None:
            env[SWITCH] = value
        proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.split() == expected.split(), (value, proc.stdout)
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env=dict(cli_env(), **{SWITCH: "yes"}), timeout=300)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines()[-1].startswith(
        f"realformer_nmt: error: {SWITCH}='yes'"), proc.stderr
