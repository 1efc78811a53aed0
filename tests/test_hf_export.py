"""``scripts/export_hf.py``: realformer_bert checkpoints (Google's, converted, and one
pre-trained here) in Hugging Face ``transformers``, computing what fairseq computes.

The exported folders are loaded the way a user loads them, through ``AutoModel*`` with
``trust_remote_code=True`` (the code comes from the folder, not from this package), and
compared with the fairseq model on the same ids: sequence output, pooled output, masked-LM
and next-sentence logits, with padding and with sentence pairs, in sum and mean mode.
"""

import ast
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

if os.environ.get("CI"):  # CI installs the test extra, which includes transformers
    import transformers
else:
    transformers = pytest.importorskip("transformers", reason="transformers not installed (pip install -e '.[hf]')")

from bert_helpers import prepared_wikitext2  # noqa: E402
from conftest import REPO, cli_env, trains  # noqa: E402
from fairseq.data.encoders.sentencepiece_bpe import SentencepieceBPE, SentencepieceConfig  # noqa: E402
from test_google_checkpoint import (  # noqa: E402
    VOCAB,
    batch,
    copy_fixture,
    fairseq_to_wordpiece,
    hub_of,
    outputs,
    to_fairseq,
)
from transformers import (  # noqa: E402
    AutoModel,
    AutoModelForMaskedLM,
    AutoModelForPreTraining,
    AutoModelForSequenceClassification,
    AutoTokenizer,
    pipeline,
)

from realformer_nmt.data.wordpiece import WordPieceTokenizer  # noqa: E402
from realformer_nmt.models.realformer_bert import google_checkpoint as gc  # noqa: E402
from realformer_nmt.models.realformer_bert import hf_export  # noqa: E402

ATOL = 1e-5
SCRIPT = REPO / "scripts" / "export_hf.py"


def export_cli(*args, check=True):
    proc = subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          env=cli_env(), cwd=REPO)
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def google(tmp_path_factory):
    """{"sum"|"mean": (converted fairseq folder, exported HF folder)}: the Google-format
    fixture converted, then exported by the command-line script."""
    root = tmp_path_factory.mktemp("hf_google")
    out = {}
    for mode in ("sum", "mean"):
        src = copy_fixture(root / f"src_{mode}", use_running_mean=mode == "mean")
        gc.convert(str(src), str(root / f"fs_{mode}"))
        export_cli(root / f"fs_{mode}", "--out", root / f"hf_{mode}")
        out[mode] = (root / f"fs_{mode}", root / f"hf_{mode}")
    return out


def hf_outputs(folder, ids, mask, types):
    """Sequence and pooled output (AutoModel), MLM and NSP logits (AutoModelForPreTraining)."""
    base = AutoModel.from_pretrained(folder, trust_remote_code=True).eval()
    pre = AutoModelForPreTraining.from_pretrained(folder, trust_remote_code=True).eval()
    kwargs = dict(input_ids=torch.as_tensor(ids), attention_mask=torch.as_tensor(mask))
    if types is not None:
        kwargs["token_type_ids"] = torch.as_tensor(types)
    with torch.no_grad():
        out = base(**kwargs)
        heads = pre(**kwargs)
    return (out.last_hidden_state.double(), out.pooler_output.double(),
            heads.prediction_logits.double(), heads.seq_relationship_logits.double())


def test_exported_folder_is_standard_and_its_code_needs_only_torch_and_transformers(google):
    _, folder = google["sum"]
    names = set(os.listdir(folder))
    assert {"config.json", "model.safetensors", "configuration_realformer.py", "modeling_realformer.py",
            "tokenizer.json", "tokenizer_config.json", "vocab.txt"} <= names
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "realformer" and config["residual_attention_mode"] == "sum"
    assert config["auto_map"]["AutoModelForMaskedLM"] == "modeling_realformer.RealFormerForMaskedLM"
    for name in ("configuration_realformer.py", "modeling_realformer.py"):
        tree = ast.parse((folder / name).read_text())
        roots = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        roots |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0}
        assert roots <= {"torch", "transformers", "dataclasses", "typing"}, (name, roots)
    # loads with fairseq and this package unimportable, from a folder outside the checkout
    code = ("import sys; sys.modules['fairseq'] = None; sys.modules['realformer_nmt'] = None\n"
            "from transformers import AutoModelForMaskedLM\n"
            f"m = AutoModelForMaskedLM.from_pretrained({str(folder)!r}, trust_remote_code=True)\n"
            "print(type(m).__name__)")
    env = {k: v for k, v in cli_env().items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=folder.parent)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "RealFormerForMaskedLM"


@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("inputs", ["single", "pairs"])
def test_google_checkpoint_exported_equals_fairseq(google, mode, inputs):
    """Every position (padded ones included) of the sequence output, the pooled output,
    MLM logits (columns in WordPiece order) and NSP logits (BERT's order: 0 = is next)."""
    fs_folder, hf_folder = google[mode]
    hub = hub_of(fs_folder)
    ids, mask, types = batch(inputs)
    assert (mask == 0).any() and (inputs == "single" or (types == 1).any())
    seq, pooled, mlm, nsp = outputs(hub, to_fairseq(hub, ids))
    got = hf_outputs(hf_folder, ids, mask, types)
    expected = (seq, pooled, mlm, nsp.flip(-1))
    column = fairseq_to_wordpiece(hub)  # fairseq column j is WordPiece id column[j]
    got = (got[0], got[1], got[2][..., column], got[3])
    for name, actual, want in zip(("sequence", "pooled", "mlm", "nsp"), got, expected):
        torch.testing.assert_close(actual, want, atol=ATOL, rtol=0, msg=name)


def test_sum_and_mean_exports_differ(google):
    ids, mask, types = batch("pairs")
    sums = hf_outputs(google["sum"][1], ids, mask, types)[0]
    means = hf_outputs(google["mean"][1], ids, mask, types)[0]
    assert (sums - means).abs().max() > 0.1


FIXTURE_TEXTS = [
    "the cat sat on the house .", "The King died , his band became GREAT !", "naïve café élan",
    "unknownword xyzzy", "the king's band (1999) -- great?", "  spaces\tand\ttabs  ",
]


def test_bert_tokenizer_fast_agrees_with_our_wordpiece_on_the_fixture_vocabulary(google):
    """Our WordPiece (google-research's algorithm, the reference) and ``tokenizers``'
    (what the exported folder uses) give the same ids on the fixture vocabulary."""
    tokenizer = AutoTokenizer.from_pretrained(google["sum"][1], trust_remote_code=True)
    ours = WordPieceTokenizer(VOCAB)
    for text in FIXTURE_TEXTS:
        expected = [VOCAB.index("[CLS]")] + [VOCAB.index(t) for t in ours.tokenize(text)] + [VOCAB.index("[SEP]")]
        assert tokenizer(text)["input_ids"] == expected, text
    pair = tokenizer("the cat sat .", "the king died .")
    a, b = len(ours.tokenize("the cat sat .")), len(ours.tokenize("the king died ."))
    assert pair["token_type_ids"] == [0] * (a + 2) + [1] * (b + 1)  # [CLS] A [SEP] | B [SEP]


def test_fill_mask_pipeline_gives_the_fairseq_hub_top_token(google):
    fs_folder, hf_folder = google["sum"]
    left, right = "the cat sat on the", "house ."
    expected = hub_of(fs_folder).fill_mask(f"{left} <mask> {right}", topk=3)
    fill = pipeline("fill-mask", model=str(hf_folder), trust_remote_code=True)
    got = fill(f"{left} [MASK] {right}", top_k=3)
    assert got[0]["token_str"] == expected[0][2]
    assert got[0]["score"] == pytest.approx(expected[0][1], abs=ATOL)
    assert [g["token_str"] for g in got] == [e[2] for e in expected]


def test_save_pretrained_round_trip_is_exact(google, tmp_path):
    _, folder = google["mean"]
    model = AutoModelForMaskedLM.from_pretrained(folder, trust_remote_code=True).eval()
    model.save_pretrained(tmp_path / "again")
    again = AutoModelForMaskedLM.from_pretrained(tmp_path / "again", trust_remote_code=True).eval()
    a, b = model.state_dict(), again.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert again.cls.predictions.decoder.weight is again.realformer.embeddings.word_embeddings.weight  # tied
    ids, mask, types = (torch.as_tensor(x) for x in batch("pairs"))
    with torch.no_grad():
        assert torch.equal(model(ids, mask, types).logits, again(ids, mask, types).logits)


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_output_attentions_are_each_layers_residual_probabilities(google, mode):
    """Recomputed from the weights and each layer's input (``output_hidden_states``) by the
    paper's rule, softmax((sum of raw scores of layers 1..n) / c_n) with padded keys out."""
    model = AutoModel.from_pretrained(google[mode][1], trust_remote_code=True).eval()
    ids, mask, types = (torch.as_tensor(x) for x in batch("pairs"))
    with torch.no_grad():
        out = model(ids, mask, types, output_attentions=True, output_hidden_states=True)
    cfg = model.config
    assert len(out.attentions) == cfg.num_hidden_layers == len(out.hidden_states) - 1
    heads, d = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
    running, vanilla_differs = 0.0, False
    for n, (layer, probs) in enumerate(zip(model.encoder.layer, out.attentions), start=1):
        x = out.hidden_states[n - 1].double()
        attn = layer.attention.self

        def split(t):
            return t.view(t.shape[0], t.shape[1], heads, d).transpose(1, 2)

        q = split(x @ attn.query.weight.double().T + attn.query.bias.double())
        k = split(x @ attn.key.weight.double().T + attn.key.bias.double())
        raw = q @ k.transpose(-1, -2) / math.sqrt(d)
        running = running + raw
        divisor = n if mode == "mean" else 1
        pad = (mask == 0)[:, None, None, :]
        expected = (running / divisor).masked_fill(pad, -1e30).softmax(-1)
        assert probs.shape == expected.shape
        torch.testing.assert_close(probs.double(), expected, atol=1e-5, rtol=0)
        assert probs.masked_select(pad.expand_as(probs)).abs().max() == 0
        if n > 1:
            vanilla = raw.masked_fill(pad, -1e30).softmax(-1)
            vanilla_differs |= (vanilla - expected).abs().max().item() > 1e-2
    assert vanilla_differs  # the residual scores change the probabilities


def labelled_set(n=96, length=8, seed=0):
    """Sentences of fixture words: label 0 draws its words from one half of the plain
    words, label 1 from the other (learnable in one short epoch)."""
    rng = np.random.default_rng(seed)
    words = [w for w in VOCAB if w.isalpha()]
    halves = (words[0::2], words[1::2])
    texts = [" ".join(rng.choice(halves[i % 2], size=length)) for i in range(n)]
    return texts, torch.tensor([i % 2 for i in range(n)])


def test_sequence_classification_fine_tunes_saves_and_reloads(google, tmp_path):
    folder = google["sum"][1]
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True, num_labels=2)
    # the pooler comes from the pre-trained checkpoint (BERT's fine-tuning), the classifier is new
    base = AutoModel.from_pretrained(folder, trust_remote_code=True)
    assert torch.equal(model.realformer.pooler.dense.weight, base.pooler.dense.weight)
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    texts, labels = labelled_set()
    enc = tokenizer(texts, padding=True, return_tensors="pt")

    def mean_loss():
        model.eval()
        with torch.no_grad():
            return model(**enc, labels=labels).loss.item()

    before = mean_loss()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for start in range(0, len(texts), 4):  # one epoch, batches of 4
        rows = slice(start, start + 4)
        loss = model(**{k: v[rows] for k, v in enc.items()}, labels=labels[rows]).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    after = mean_loss()
    assert after < before - 0.05, (before, after)

    model.save_pretrained(tmp_path / "finetuned")
    tokenizer.save_pretrained(tmp_path / "finetuned")
    again = AutoModelForSequenceClassification.from_pretrained(tmp_path / "finetuned", trust_remote_code=True).eval()
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(**enc).logits, again(**enc).logits)


# --------------------------------------------------------------------------------------
# refusals
# --------------------------------------------------------------------------------------


def test_a_translation_checkpoint_is_refused_in_one_line(tmp_path):
    """A realformer_transformer checkpoint as fairseq-train writes it (config + weights)."""
    from conftest import build
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from omegaconf import OmegaConf

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [str(tmp_path), "--task", "translation", "--arch",
                                                "realformer_transformer", "--user-dir", str(REPO / "realformer_nmt")])
    config = OmegaConf.to_container(convert_namespace_to_omegaconf(args), resolve=True, enum_to_str=True)
    path = tmp_path / "checkpoint_last.pt"
    torch.save({"args": None, "cfg": config, "model": build("realformer_transformer").state_dict(),
                "optimizer_history": [{"criterion_name": "CrossEntropyCriterion", "optimizer_name": "none",
                                       "lr_scheduler_state": {}, "num_updates": 0}],
                "extra_state": {}, "last_optimizer_state": None}, path)
    proc = export_cli(path, "--out", tmp_path / "hf", check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "not realformer_bert" in lines[0] and "realformer_transformer" in lines[0], proc.stderr
    assert not (tmp_path / "hf").exists()


def test_missing_checkpoint_and_help_are_one_line_and_fast(tmp_path):
    proc = export_cli(tmp_path / "nope.pt", "--out", tmp_path / "hf", check=False)
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "no such file" in proc.stderr
    assert "CHECKPOINT" in export_cli("--help").stdout


# --------------------------------------------------------------------------------------
# a model pre-trained here (masked_lm_nsp on WikiText-2, SentencePiece + fairseq dictionary)
# --------------------------------------------------------------------------------------


def spm_pieces_missing_from(data):
    """SentencePiece pieces (not control/unknown) that ``data/dict.txt`` lacks."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(data / "spm.model"))
    symbols = {line.split(" ")[0] for line in (data / "dict.txt").read_text(encoding="utf-8").splitlines()}
    pieces = (sp.id_to_piece(i) for i in range(sp.get_piece_size()) if not (sp.is_control(i) or sp.is_unknown(i)))
    return [p for p in pieces if p not in symbols and p != "<unk>"]


@pytest.fixture(scope="module")
@trains
def pretrained_export(tmp_path_factory):
    """A 16-update masked_lm_nsp run of realformer_bert_small (tiny dims) on WikiText-2
    prepared with ``--full-vocabulary`` (dict.txt also lists the SentencePiece pieces the
    train text never produced, after fairseq's own entries), exported by the command-line
    script."""
    from bert_helpers import TEST_VOCAB, WIKITEXT2, pretrain_flags
    from cli_helpers import run

    from realformer_nmt.data import pretraining

    prepared = prepared_wikitext2(tmp_path_factory)
    root = tmp_path_factory.mktemp("hf_pretrained")
    data = root / "data"
    pretraining.prepare_pretraining(str(WIKITEXT2), str(data), vocab_size=TEST_VOCAB, full_vocabulary=True,
                                    log=lambda m: None)
    assert not spm_pieces_missing_from(data)
    # the train text's own entries keep their ids: the same binaries as without the flag
    own = (prepared / "dict.txt").read_text(encoding="utf-8").splitlines()
    full = (data / "dict.txt").read_text(encoding="utf-8").splitlines()
    assert full[:len(own)] == own and len(full) > len(own)
    assert all(line.endswith(" 0") for line in full[len(own):])
    assert (data / "train.bin").read_bytes() == (prepared / "train.bin").read_bytes()
    run("fairseq-train", *pretrain_flags(data, root / "ckpt"))
    out = root / "hf"
    proc = export_cli(root / "ckpt" / "checkpoint_last.pt", "--out", out, "--data", data)
    return root / "ckpt" / "checkpoint_last.pt", data, out, json.loads(proc.stdout), prepared


def test_pretrained_model_exported_equals_fairseq(pretrained_export):
    checkpoint, data, folder, summary, prepared = pretrained_export
    assert summary["tokenizer_texts_checked"] > 100  # the fixed samples + the valid split's sentences
    hub, _, _ = hf_export.load_hub(str(checkpoint), str(data))
    hub.bpe = SentencepieceBPE(SentencepieceConfig(sentencepiece_model=str(data / "spm.model")))
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    texts = ["The film was released in 2001 .", "It was a success in Europe and in the United States ."]
    for text in texts + ["A <unk>s word , then  two   spaces"]:
        assert tokenizer(text)["input_ids"] == hub.encode(text).tolist(), text
    pair = ("The film was released in 2001 .", "It was a success .")
    assert tokenizer(*pair)["input_ids"] == hub.encode(*pair).tolist()  # RoBERTa's <s> A </s> </s> B </s>

    for enc in (tokenizer(texts, padding=True, return_tensors="pt"),
                tokenizer([pair[0], texts[1]], [pair[1], "Yes ."], padding=True, return_tensors="pt")):
        ids, mask = enc["input_ids"], enc["attention_mask"]
        assert (mask == 0).any()
        seq, pooled, mlm, nsp = outputs(hub, ids)
        got = hf_outputs(folder, ids, mask, None)
        for name, actual, want in zip(("sequence", "pooled", "mlm", "nsp"), got, (seq, pooled, mlm, nsp.flip(-1))):
            torch.testing.assert_close(actual, want, atol=ATOL, rtol=0, msg=name)

    fill = pipeline("fill-mask", model=str(folder), trust_remote_code=True)
    expected = hub.fill_mask("The film was <mask> in 2001 .", topk=2)
    got = fill("The film was <mask> in 2001 .", top_k=2)
    assert got[0]["score"] == pytest.approx(expected[0][1], abs=ATOL)
    if expected[0][1] - expected[1][1] > 1e-4:  # a clear winner
        assert got[0]["token_str"].strip() == expected[0][2].strip()


def test_a_dictionary_missing_pieces_is_refused_in_one_line(pretrained_export):
    """The prepared data's own dict.txt lacks pieces the train text never produced."""
    from fairseq.data import Dictionary

    from realformer_nmt.errors import ConfigError

    prepared = pretrained_export[-1]
    missing = spm_pieces_missing_from(prepared)
    assert missing
    with pytest.raises(ConfigError, match=f"lacks {len(missing)} of") as e:
        hf_export.sentencepiece_tokenizer(str(prepared / "spm.model"), Dictionary.load(str(prepared / "dict.txt")),
                                          False, 64)
    assert "\n" not in str(e.value)
