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
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

if os.environ.get("CI"):  # CI installs the test extra, which includes transformers
    import transformers
else:
    transformers = pytest.importorskip("transformers", reason="transformers not installed (pip install -e '.[hf]')")

from bert_helpers import WIKITEXT2, prepared_wikitext2  # noqa: E402
from conftest import MULTI30K, REPO, cli_env, require_shared_data, trains  # noqa: E402
from fairseq.data.encoders.sentencepiece_bpe import SentencepieceBPE, SentencepieceConfig  # noqa: E402
from inprocess import run_in_process  # noqa: E402
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

from realformer_nmt.models.realformer_bert.wordpiece import WordPieceTokenizer  # noqa: E402
from realformer_tools.convert import google_checkpoint as gc  # noqa: E402
from realformer_tools.hf import hf_export  # noqa: E402
from realformer_tools.hf import modeling as hf_files  # noqa: E402

ATOL = 1e-5
SCRIPT = REPO / "scripts" / "export_hf.py"

# fairseq's own checkpoint loaders run in this process (hub interfaces, the export): with the fixes
pytestmark = pytest.mark.usefixtures("fairseq_fixes")


def export_cli(*args, check=True):
    """The script's main in this process (tests/inprocess.py: stdout, stderr and exit status as a
    subprocess gives them); test_bad_input_is_one_line runs the script itself for --help."""
    proc = run_in_process("realformer-export-hf", *args, check=False, cwd=REPO, argv0=SCRIPT)
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


AUTO_CLASSES = ("AutoModel", "AutoModelForMaskedLM", "AutoModelForPreTraining", "AutoModelForNextSentencePrediction",
                "AutoModelForSequenceClassification", "AutoModelForMultipleChoice",
                "AutoModelForTokenClassification", "AutoModelForQuestionAnswering")


def isolated(code, folder):
    """Run ``code`` in a process where fairseq and this package cannot be imported, from a
    folder outside the checkout, stdin closed (an interactive prompt would read EOF)."""
    code = "import sys; sys.modules['fairseq'] = None; sys.modules['realformer_nmt'] = None\n" + code
    env = {k: v for k, v in cli_env().items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=folder.parent, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Do you wish to run the custom code" not in proc.stdout + proc.stderr
    return proc.stdout.strip().splitlines()


def test_exported_folder_is_standard_and_its_code_needs_only_torch_and_transformers(google):
    _, folder = google["sum"]
    names = set(os.listdir(folder))
    assert {"config.json", "model.safetensors", "configuration_realformer.py", "modeling_realformer.py",
            "modeling_realformer_encoder.py", "tokenizer.json", "tokenizer_config.json", "vocab.txt",
            "README.md", "export.json"} <= names
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "realformer" and config["residual_attention_mode"] == "sum"
    assert config["auto_map"]["AutoModelForMaskedLM"] == "modeling_realformer.RealFormerForMaskedLM"
    assert set(AUTO_CLASSES) < set(config["auto_map"])
    for name in hf_files.FILES:
        tree = ast.parse((folder / name).read_text())
        roots = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        roots |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0}
        assert roots <= {"torch", "transformers", "dataclasses", "typing"}, (name, roots)
    # every head, the tokenizer and a forward pass with fairseq and this package unimportable
    code = ("import torch, transformers\n"
            f"folder = {str(folder)!r}\n"
            "tok = transformers.AutoTokenizer.from_pretrained(folder, trust_remote_code=True)\n"
            "enc = tok(['the cat sat .', 'the king died .'], padding=True, return_tensors='pt')\n"
            # the tokenizer is no remote code: its own class loads it without trust_remote_code
            "plain = transformers.PreTrainedTokenizerFast.from_pretrained(folder)\n"
            "assert plain(['the cat sat .'])['input_ids'] == tok(['the cat sat .'])['input_ids']\n"
            f"for name in {AUTO_CLASSES!r}:\n"
            "    m = getattr(transformers, name).from_pretrained(folder, trust_remote_code=True).eval()\n"
            "    x = {k: v.unsqueeze(1) for k, v in enc.items()} if 'Multiple' in name else enc\n"
            "    out = m(**x)\n"
            "    print(type(m).__name__, type(tok).__name__)\n")
    lines = isolated(code, folder)
    assert [line.split()[0] for line in lines[-len(AUTO_CLASSES):]] == [
        "RealFormerModel", "RealFormerForMaskedLM", "RealFormerForPreTraining", "RealFormerForNextSentencePrediction",
        "RealFormerForSequenceClassification", "RealFormerForMultipleChoice", "RealFormerForTokenClassification",
        "RealFormerForQuestionAnswering"]
    assert lines[-1].split()[1] == "BertTokenizer"


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
# the heads and tools of BERT's Hugging Face code
# --------------------------------------------------------------------------------------


def load(cls, folder, **kwargs):
    return getattr(transformers, cls).from_pretrained(folder, trust_remote_code=True, **kwargs).eval()


def test_the_task_heads_compute_berts_heads_over_the_encoder(google):
    """Each head recomputed from ``AutoModel``'s outputs and the head's own weights, with
    BERT's losses (cross-entropy, ignored labels, QA's clamped positions)."""
    import torch.nn.functional as F

    folder = google["mean"][1]
    ids, mask, types = (torch.as_tensor(x) for x in batch("pairs"))
    base = load("AutoModel", folder)
    with torch.no_grad():
        out = base(ids, mask, types)
        seq, pooled = out.last_hidden_state, out.pooler_output
        nsp = load("AutoModelForNextSentencePrediction", folder)
        rows = torch.arange(len(ids))
        got = nsp(ids, mask, types, labels=rows % 2)
        torch.testing.assert_close(got.logits, load("AutoModelForPreTraining", folder)(ids, mask, types)
                                   .seq_relationship_logits, atol=0, rtol=0)
        torch.testing.assert_close(got.loss, F.cross_entropy(got.logits, rows % 2))

        torch.manual_seed(0)
        tc = load("AutoModelForTokenClassification", folder, num_labels=5)
        labels = torch.randint(0, 5, ids.shape).masked_fill(mask == 0, -100)
        got = tc(ids, mask, types, labels=labels)
        want = seq @ tc.classifier.weight.T + tc.classifier.bias
        torch.testing.assert_close(got.logits, want, atol=1e-6, rtol=0)
        keep = labels.ne(-100)
        torch.testing.assert_close(got.loss, F.cross_entropy(want[keep], labels[keep]), atol=1e-6, rtol=0)

        qa = load("AutoModelForQuestionAnswering", folder)
        start, end = rows + 1, rows + 2
        start[0] = 99  # outside the input: clamped and ignored, as BERT's
        got = qa(ids, mask, types, start_positions=start, end_positions=end)
        both = seq @ qa.qa_outputs.weight.T + qa.qa_outputs.bias
        torch.testing.assert_close(got.start_logits, both[..., 0], atol=1e-6, rtol=0)
        torch.testing.assert_close(got.end_logits, both[..., 1], atol=1e-6, rtol=0)
        loss = (F.cross_entropy(both[1:, :, 0], start[1:]) + F.cross_entropy(both[..., 1], end)) / 2
        torch.testing.assert_close(got.loss, loss, atol=1e-6, rtol=0)

        mc = load("AutoModelForMultipleChoice", folder)
        got = mc(ids.unsqueeze(0), mask.unsqueeze(0), types.unsqueeze(0), labels=torch.tensor([1]))
        want = (pooled @ mc.classifier.weight.T + mc.classifier.bias).view(1, -1)
        torch.testing.assert_close(got.logits, want, atol=1e-6, rtol=0)
        torch.testing.assert_close(got.loss, F.cross_entropy(want, torch.tensor([1])), atol=1e-6, rtol=0)


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_sdpa_equals_eager_forward_and_backward(google, mode):
    folder = google[mode][1]
    ids, mask, types = (torch.as_tensor(x) for x in batch("pairs"))
    models = {impl: load("AutoModelForPreTraining", folder, attn_implementation=impl) for impl in ("eager", "sdpa")}
    assert models["sdpa"].config._attn_implementation == "sdpa"
    grads, outs = {}, {}
    for impl, model in models.items():
        out = model(ids, mask, types, output_hidden_states=True)
        outs[impl] = out
        (out.prediction_logits.square().mean() + out.seq_relationship_logits.sum()).backward()
        grads[impl] = {n: p.grad for n, p in model.named_parameters()}
    torch.testing.assert_close(outs["sdpa"].prediction_logits, outs["eager"].prediction_logits, atol=2e-5, rtol=0)
    torch.testing.assert_close(outs["sdpa"].hidden_states, outs["eager"].hidden_states, atol=2e-5, rtol=0)
    for name, grad in grads["eager"].items():
        torch.testing.assert_close(grads["sdpa"][name], grad, atol=2e-5, rtol=1e-4, msg=name)
    with torch.no_grad():  # output_attentions: the probabilities, as eager gives them
        a = models["sdpa"](ids, mask, types, output_attentions=True).attentions
        b = models["eager"](ids, mask, types, output_attentions=True).attentions
    torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def sdpa_calls(monkeypatch):
    """A list that grows by one at each call of torch's scaled_dot_product_attention."""
    import torch.nn.functional as F

    calls, real = [], F.scaled_dot_product_attention

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", counted)
    return calls


@pytest.mark.parametrize("cls", ["AutoModel", "AutoModelForPreTraining"])
def test_set_attn_implementation_switches_a_loaded_model(google, cls, monkeypatch):
    """As BERT's: ``model.set_attn_implementation`` after loading changes the kernel the
    next forward runs (counted), not only the config, without the "does not support
    setting its attention implementation dynamically" warning; flash attention is refused."""
    from transformers import modeling_utils

    warnings = []
    monkeypatch.setattr(modeling_utils.logger, "warning", lambda msg, *a, **k: warnings.append(str(msg)))
    calls = sdpa_calls(monkeypatch)
    model = load(cls, google["mean"][1])
    ids, mask, types = (torch.as_tensor(x) for x in batch("pairs"))
    layers = model.config.num_hidden_layers
    outputs = {}
    with torch.no_grad():
        for impl in ("sdpa", "eager", "sdpa"):
            model.set_attn_implementation(impl)
            assert model.config._attn_implementation == impl
            calls.clear()
            outputs[impl] = model(ids, mask, types)[0]
            assert len(calls) == (layers if impl == "sdpa" else 0), (impl, len(calls))
    assert not [w for w in warnings if "attention implementation" in w], warnings
    torch.testing.assert_close(outputs["eager"], outputs["sdpa"], atol=2e-5, rtol=0)
    with pytest.raises(ValueError, match="Flash Attention"):
        model.set_attn_implementation("flash_attention_2")
    assert model.config._attn_implementation == "sdpa"


# onnxruntime against torch, both float32: the same operations in another order (ONNX
# Runtime's MatMul, Softmax and LayerNormalization kernels), each with a relative error near
# float32's 6e-8, summed over a few layers of O(1) activations (measured on the three kinds of
# export: at most 3.7e-6, on masked-LM logits up to 7.6); 1e-5 is the float32 tolerance these
# tests give fairseq against the Hugging Face code, and rtol 1e-5 covers larger logits. A wrong
# graph is off by far more.
ONNX_ATOL = ONNX_RTOL = 1e-5


def onnx_runtime():
    """onnxruntime, or a skip naming what is missing: the ONNX extra is optional."""
    import importlib

    missing = []
    for name in ("onnx", "onnxscript", "onnxruntime"):
        try:
            importlib.import_module(name)
        except ImportError:
            missing.append(name)
    if missing:
        pytest.skip(f"the ONNX export test needs {', '.join(missing)} (pip install -e '.[onnx]')")
    import onnxruntime

    return onnxruntime


@pytest.mark.parametrize("cls,dynamic", [("AutoModel", False), ("AutoModelForMaskedLM", True),
                                         ("AutoModelForPreTraining", False),
                                         ("AutoModelForSequenceClassification", False)])
def test_default_onnx_export_of_each_head_matches_onnxruntime(google, cls, dynamic, tmp_path):
    """``torch.onnx.export(..., dynamo=True)`` (torch's default exporter) of each head as
    loaded (sdpa attention), run by onnxruntime: every output equals torch's. It used to
    fail "Cannot view a tensor" where sdpa's output was reshaped. The masked LM is exported
    with a dynamic batch and length and run on a second shape."""
    ort = onnx_runtime()
    kwargs = {"num_labels": 3} if "Sequence" in cls else {}
    model = load(cls, google["mean"][1], **kwargs)
    assert model.config._attn_implementation == "sdpa"
    ids, mask, types = (torch.as_tensor(x).long() for x in batch("pairs"))
    shapes = None
    if dynamic:
        dims = {0: torch.export.Dim("batch"), 1: torch.export.Dim("length")}
        shapes = (dims, dims, dims)
    program = torch.onnx.export(model, (ids, mask, types), dynamo=True, dynamic_shapes=shapes, verbose=False)
    program.save(str(tmp_path / "model.onnx"))
    session = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["input_ids", "attention_mask", "token_type_ids"]
    inputs = [(ids, mask, types)]
    if dynamic:
        inputs.append((ids[:2, :13], mask[:2, :13], types[:2, :13]))
    for x in inputs:
        assert (x[1] == 0).any()  # padding
        with torch.no_grad():
            want = model(*x, return_dict=False)
        got = session.run(None, {i.name: t.numpy() for i, t in zip(session.get_inputs(), x)})
        assert len(got) == len(want)
        for g, w in zip(got, want):
            torch.testing.assert_close(torch.from_numpy(g), w, atol=ONNX_ATOL, rtol=ONNX_RTOL)


def test_gradient_checkpointing_gives_the_same_gradients(google):
    """With dropout on (same seed): every gradient equal; and the layers really run twice."""
    folder = google["sum"][1]
    ids, mask, types = (torch.as_tensor(x) for x in batch("pairs"))
    model = load("AutoModelForSequenceClassification", folder, num_labels=2, hidden_dropout_prob=0.1,
                 attention_probs_dropout_prob=0.1)
    model.train()
    calls = []
    model.realformer.encoder.layer[0].intermediate.dense.register_forward_hook(lambda *a: calls.append(1))

    def gradients():
        calls.clear()
        model.zero_grad()
        torch.manual_seed(3)
        model(ids, mask, types, labels=torch.arange(len(ids)) % 2).loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}, len(calls)

    plain, plain_calls = gradients()
    model.activation_checkpointing_enable()  # transformers 5's name; gradient_checkpointing_enable is its alias
    again, again_calls = gradients()
    assert (plain_calls, again_calls) == (1, 2)  # recomputed in the backward pass
    assert max(g.abs().max().item() for g in plain.values()) > 0
    for name, grad in plain.items():
        torch.testing.assert_close(again[name], grad, atol=1e-6, rtol=0, msg=name)


def test_resize_token_embeddings_resizes_the_output_bias_and_keeps_old_logits(google, tmp_path):
    folder = google["sum"][1]
    ids, mask, types = (torch.as_tensor(x) for x in batch("pairs"))
    model = load("AutoModelForMaskedLM", folder)
    vocab = model.config.vocab_size
    with torch.no_grad():
        before = model(ids, mask, types).logits
    bias = model.cls.predictions.bias.detach().clone()
    model.resize_token_embeddings(vocab + 5)
    assert model.config.vocab_size == vocab + 5 and model.cls.predictions.bias.shape == (vocab + 5,)
    assert model.cls.predictions.decoder.weight is model.realformer.embeddings.word_embeddings.weight
    torch.testing.assert_close(model.cls.predictions.bias[vocab:], bias.mean().expand(5))
    with torch.no_grad():
        after = model(ids, mask, types).logits
    assert after.shape[-1] == vocab + 5
    torch.testing.assert_close(after[..., :vocab], before, atol=1e-5, rtol=0)
    new_ids = ids.long().masked_fill(ids.eq(5), vocab + 4)  # a new token in the input trains
    model.train()
    model(new_ids, mask, types, labels=new_ids).loss.backward()
    assert model.realformer.embeddings.word_embeddings.weight.grad[vocab + 4].abs().sum() > 0
    model.eval().save_pretrained(tmp_path / "resized")
    again = load("AutoModelForMaskedLM", tmp_path / "resized")
    with torch.no_grad():
        assert torch.equal(again(ids, mask, types).logits, model(ids, mask, types).logits)
    model.resize_token_embeddings(vocab - 2)
    with torch.no_grad():
        assert model(ids.clamp(max=vocab - 3), mask, types).logits.shape[-1] == vocab - 2


def test_an_input_longer_than_the_position_table_is_a_clear_error(google):
    model = load("AutoModel", google["sum"][1])
    limit = model.config.max_position_embeddings  # BERT's positions: token t at row t
    with pytest.raises(ValueError, match=f"{limit + 1} tokens is longer than this model's {limit} positions"):
        model(torch.ones(1, limit + 1, dtype=torch.long))
    with torch.no_grad():
        model(torch.ones(1, limit, dtype=torch.long))  # the longest input runs


def test_token_type_ids_without_segment_embeddings_and_fairseq_lengths_are_clear_errors(pretrained_export):
    model = load("AutoModel", pretrained_export[2])  # RoBERTa-style: no segment embeddings
    ids = torch.tensor([[0, 100, 200, 2]])
    with pytest.raises(ValueError, match="no token type .segment. embeddings"):
        model(ids, token_type_ids=torch.tensor([[0, 0, 1, 1]]))
    with torch.no_grad():  # zeros say nothing the model does not assume
        torch.testing.assert_close(model(ids, token_type_ids=torch.zeros_like(ids)).last_hidden_state,
                                   model(ids).last_hidden_state, atol=0, rtol=0)
    # fairseq's positions start after the padding index: pad + 1 rows fewer
    limit = model.config.max_position_embeddings - model.config.pad_token_id - 1
    with pytest.raises(ValueError, match=f"{limit + 1} tokens is longer than this model's {limit} positions"):
        model(torch.full((1, limit + 1), 100))


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
    help_text = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, env=cli_env(),
                               cwd=REPO, timeout=300).stdout  # the script as a user runs it
    assert "CHECKPOINT" in help_text


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

    from realformer_tools.data import pretraining

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
    run_in_process("fairseq-train", *pretrain_flags(data, root / "ckpt"))
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


def test_the_pretrained_card_names_its_data_and_run(pretrained_export):
    """The run and its data as the checkpoint and the data dir's prepare.json record them,
    WikiText-2's license, and the validation loss the checkpoint was saved with."""
    import yaml
    from fairseq import checkpoint_utils

    checkpoint, data, folder, summary, _ = pretrained_export
    card = read_card(folder)
    state = checkpoint_utils.load_checkpoint_to_cpu(str(checkpoint))
    prepared = json.loads((data / "prepare.json").read_text())
    updates = state["optimizer_history"][-1]["num_updates"]
    assert f"`fairseq-train --task masked_lm_nsp --arch {state['cfg']['model'].arch}`" in card
    assert f"; {updates} updates (in epoch {state['extra_state']['train_iterator']['epoch']})" in card
    for split in ("train", "valid"):
        raw = prepared["settings"]["raw_files"][split]
        assert f"`wikitext-2/{os.path.basename(raw)}`" in card
        assert f"{prepared['documents'][split]['words']:,} words" in card
    assert "the corpus's test split, used as training text" in card  # shared/data has no train split
    assert "CC BY-SA 3.0" in card and "WikiText-2" in card
    assert f"**{state['extra_state']['val_loss']}** (in bits" in card
    assert "samples of 64 tokens, so the positions past that were never trained" in card
    assert yaml.safe_load(card.split("---\n")[1])["language"] == "en"
    assert summary["training"]["run"]["updates"] == updates and summary["training"]["corpus"]["name"] == "WikiText-2"


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


def test_export_json_holds_no_machine_path_and_the_card_has_the_hub_header(pretrained_export, google):
    import yaml

    folder, summary = pretrained_export[2], pretrained_export[3]
    written = json.loads((folder / "export.json").read_text())
    strings = [v for v in json.dumps(written).split('"') if "/" in v or "\\" in v]
    assert not any(os.path.isabs(v) for v in strings), strings
    assert written["checkpoint"] == "checkpoint_last.pt" and summary["out"] == str(folder)  # the printed one says
    for kind, path, license, pipeline_tag in (("here", folder, "mit", "fill-mask"),
                                              ("google", google["mean"][1], "apache-2.0", "fill-mask")):
        card = (path / "README.md").read_text()
        assert card.startswith("---\n")
        meta = yaml.safe_load(card.split("---\n")[1])
        assert meta["license"] == license and meta["library_name"] == "transformers", kind
        assert meta["pipeline_tag"] == pipeline_tag and {"realformer", "bert"} <= set(meta["tags"]), kind
        exported = json.loads((path / "export.json").read_text())
        assert f"**{exported['residual_attention_mode']}**" in card and "2012.11747" in card
        assert exported["checkpoint"] in card and str(path) not in card
        for name, value in exported["verified"]["max_abs_diff"].items():
            assert f"{name} {value:.2g}" in card and value < 1e-4
        assert "trust_remote_code=True" in card


CARD_SECTIONS = ("## Training data and run", "## Intended use", "## Limitations", "## Evaluation", "## How to load",
                 "## License", "## Citation")


def read_card(folder):
    """The card's text, after the checks every card passes: its sections, no undefined
    placeholder, the snippet runs as printed (from the folder holding the export, with
    fairseq and this package unimportable), and the table of auto classes says what each
    class loads: the modules it names as fresh are exactly those ``from_pretrained``
    reports missing (or mismatched, where the row says to ignore that)."""
    import re

    card = (folder / "README.md").read_text(encoding="utf-8")
    assert [line for line in card.splitlines() if line.startswith("## ")] == list(CARD_SECTIONS)
    assert "FOLDER" not in card and "Apache-2.0);" not in card and "None" not in card.split("<!-- export.json")[0]
    snippet = re.search(r"```python\n(.*?)```", card, re.S).group(1)
    assert f'path = "{folder.name}"' in snippet
    printed = isolated(snippet, folder)
    assert printed and ("score" in printed[-1]), printed
    rows = re.findall(r"^\| `(Auto\w+)` \| (.*?) \| (.*?) \|$", card, re.M)
    assert [r[0] for r in rows] == list(AUTO_CLASSES)  # each class once
    for cls, trained, fresh in rows:
        ignore = "ignore_mismatched_sizes=True" in trained
        _, info = getattr(transformers, cls).from_pretrained(folder, trust_remote_code=True, output_loading_info=True,
                                                             ignore_mismatched_sizes=ignore)
        reported = list(info["missing_keys"]) + [k[0] for k in info["mismatched_keys"]]
        assert bool(info["mismatched_keys"]) == ignore, cls
        modules = {re.sub(r"^realformer\.", "", k).rsplit(".", 1)[0] for k in reported}
        assert modules == set(re.findall(r"`([\w.]+)`", fresh)), (cls, modules, fresh)
        assert trained.startswith("encoder"), cls
    return card


def test_the_google_card_answers_a_hub_reader(google):
    import yaml

    folder = google["sum"][1]
    card = read_card(folder)
    conversion = json.loads((google["sum"][0] / "conversion.json").read_text())
    assert f"`{conversion['source']}`" in card and "convert_google_checkpoint.py" in card
    assert "does not say what they were pre-trained on" in card  # Google's README does not
    assert "match none of Google's releases" in card  # the fixture's dimensions are no release's
    assert "uncased: lower-cases its input" in card and conversion["lowercase"]
    assert "AutoModelForMaskedLM" in card.split("```python")[1].split("```")[0]
    assert "| `AutoModelForPreTraining` | encoder, masked-LM head, pooler (NSP's), NSP classifier | — |" in card
    assert yaml.safe_load(card.split("---\n")[1])["license"] == "apache-2.0"
    exported = json.loads((folder / "export.json").read_text())
    assert exported["training"]["google"]["source"] == conversion["source"]
    assert exported["training"]["run"] is None  # a conversion, not a fairseq run


def wikitext_valid_lines():
    require_shared_data(WIKITEXT2)
    return [line for line in (WIKITEXT2 / "valid.txt").read_text(encoding="utf-8").split("\n") if line.strip()]


def test_sentencepiece_tokenizer_gives_fairseqs_ids_on_raw_wikitext_and_whitespace(pretrained_export):
    """Every non-empty line of WikiText-2's valid.txt (each ends with a space), whitespace-
    only input and no-break spaces: the ids of SentencePiece's pieces, as hub.encode gives."""
    import sentencepiece as spm

    checkpoint, data, folder, _, _ = pretrained_export
    hub, _, _ = hf_export.load_hub(str(checkpoint), str(data))
    hub.bpe = SentencepieceBPE(SentencepieceConfig(sentencepiece_model=str(data / "spm.model")))
    sp = spm.SentencePieceProcessor(model_file=str(data / "spm.model"))
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    lines = wikitext_valid_lines()
    assert len(lines) > 2000 and all(line.endswith(" ") for line in lines)
    edge = ["The film was released in 2001 . ", " ", "", "   \t ", "trailing no-break space\u00a0", "\u00a0",
            "\u00a0inside\u00a0\u00a0and\u3000ideographic "]
    d = hub.task.source_dictionary
    for text in lines + edge:
        ids = tokenizer(text)["input_ids"]
        assert ids == hub.encode(text).tolist(), text
        assert ids == [d.bos()] + [d.index(p) for p in sp.encode(text, out_type=str)] + [d.eos()], text
    # SentencePiece keeps NEL (U+0085) as a piece of its own; fairseq splits the pieces on
    # Python's whitespace and drops it: the tokenizer follows fairseq, not the pieces
    for text in ("a\u0085b", "dog \u0085 cat", "two\u0085\u0085inside", "\u0085", "end\u0085"):
        assert "\u0085" in "".join(sp.encode(text, out_type=str)), text
        assert tokenizer(text)["input_ids"] == hub.encode(text).tolist(), text
    tokens = tokenizer.convert_ids_to_tokens(tokenizer(edge[0])["input_ids"])
    assert tokens[-2:] == ["\u2581.", "</s>"] and "\u2581" not in tokens  # no stray piece for the trailing space
    assert tokenizer(" ")["input_ids"] == tokenizer("")["input_ids"] == [d.bos(), d.eos()]
    # the symptom: a trailing space changed the pooled output; now every output is fairseq's
    enc = tokenizer([lines[1], lines[2]], padding=True, truncation=True, return_tensors="pt")
    seq, pooled, mlm, nsp = outputs(hub, enc["input_ids"])
    got = hf_outputs(folder, enc["input_ids"], enc["attention_mask"], None)
    torch.testing.assert_close(got[1], pooled, atol=ATOL, rtol=0)
    torch.testing.assert_close(got[0], seq, atol=ATOL, rtol=0)


def test_sentencepiece_tokenizer_names_its_unknown_token(pretrained_export, tmp_path):
    """As BERT's tokenizers name [UNK]: ``unk_token`` is ``<unk>`` (fairseq's id), an unknown
    string converts to it, and the literal ``<unk>`` of WikiText (a SentencePiece piece)
    still encodes as fairseq encodes it wherever it stands, also after a save and reload."""
    from transformers import PreTrainedTokenizerFast

    checkpoint, data, folder, summary, _ = pretrained_export
    hub, _, _ = hf_export.load_hub(str(checkpoint), str(data))
    hub.bpe = SentencepieceBPE(SentencepieceConfig(sentencepiece_model=str(data / "spm.model")))
    d = hub.task.source_dictionary
    assert summary["tokenizer_literal_unk"] and "<unk>" in hf_export.user_defined_pieces(str(data / "spm.model"))
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    tokenizer.save_pretrained(tmp_path / "again")
    again = PreTrainedTokenizerFast.from_pretrained(tmp_path / "again")
    texts = hf_export.LITERAL_UNK_TEXT + ["\u4e2d\u6587 text", "a <unk> b", "<unk> a", " <unk>", "x<unk>y"]
    for tok in (tokenizer, again):
        assert tok.unk_token == "<unk>" and tok.unk_token_id == d.unk() == 3
        assert tok.convert_tokens_to_ids("zzqq") == d.unk()
        assert "<unk>" in tok.all_special_tokens
        assert tok("\u4e2d")["input_ids"][-2] == d.unk()  # a character SentencePiece does not know
        for text in texts:
            assert tok(text)["input_ids"] == hub.encode(text).tolist(), text
    # the one exception the card names: the text "<unk>" alone is the token itself
    assert tokenizer("<unk>")["input_ids"] == [d.bos(), d.unk(), d.eos()]
    assert hub.encode("<unk>").tolist() == [d.bos(), d.index("\u2581"), d.unk(), d.eos()]


def test_the_exports_own_check_reads_raw_text_and_catches_a_stray_piece(pretrained_export, monkeypatch):
    """Without the trailing-whitespace strip, the tokenizer passes on texts decoded back from
    pieces (what the check used to read) and fails on the raw valid lines it reads now."""
    import tokenizers
    from fairseq.data import data_utils
    from tokenizers import Regex

    from realformer_nmt.errors import ConfigError

    checkpoint, data, _, _, _ = pretrained_export
    hub, _, _ = hf_export.load_hub(str(checkpoint), str(data))
    hub.bpe = SentencepieceBPE(SentencepieceConfig(sentencepiece_model=str(data / "spm.model")))
    real = tokenizers.normalizers.Replace
    calls = []

    def without_strip(pattern, content):
        calls.append(content)
        return real(Regex(" {2,}"), " ") if len(calls) == 2 else real(pattern, content)  # 2nd: the strip

    monkeypatch.setattr(tokenizers.normalizers, "Replace", without_strip)
    old = hf_export.sentencepiece_tokenizer(str(data / "spm.model"), hub.task.source_dictionary, False, 64)
    assert calls[:2] == [" ", ""]  # the collapse of spaces, then the strip (then the <unk> word boundaries)
    dataset = data_utils.load_indexed_dataset(str(data / "valid"), hub.task.source_dictionary)
    decoded = [hub.bpe.decode(hub.task.source_dictionary.string(dataset[i])) for i in range(50)]
    assert hf_export.check_tokenizer(old, hub, [t for t in decoded if t.strip()]) > 10
    raw = hf_export.raw_valid_text(str(data))
    assert raw == wikitext_valid_lines()[:200]
    with pytest.raises(ConfigError, match="refusing to export a tokenizer that differs"):
        hf_export.check_tokenizer(old, hub, raw)


def test_a_refused_export_writes_nothing(pretrained_export, tmp_path):
    """The tokenizer is refused (a dictionary symbol that is no SentencePiece piece) after
    the model loaded: OUT keeps only what it held, and no temporary folder is left."""
    checkpoint, data = pretrained_export[:2]
    bad = tmp_path / "data"
    shutil.copytree(data, bad, ignore=shutil.ignore_patterns("work", "*.bin", "*.idx"))
    lines = (bad / "dict.txt").read_text(encoding="utf-8").splitlines()
    lines[-1] = "zzqq_no_piece 0"
    (bad / "dict.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    for out in (tmp_path / "new" / "hf", tmp_path / "old"):
        if out.name == "old":
            out.mkdir()
            (out / "notes.txt").write_text("mine")
        proc = export_cli(checkpoint, "--out", out, "--data", bad, check=False)
        errors = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and "lacks 1 of" in errors[-1], proc.stderr[-2000:]
        assert errors[-1].startswith("export_hf.py: error:")
    assert not (tmp_path / "new").exists()
    assert sorted(os.listdir(tmp_path / "old")) == ["notes.txt"]
    assert sorted(os.listdir(tmp_path)) == ["data", "old"]


def test_hf_folder_is_ignored_by_git():
    assert "/hf/" in (REPO / ".gitignore").read_text().splitlines()


# --------------------------------------------------------------------------------------
# a sentence_prediction fine-tune (a caption task made from Multi30k)
# --------------------------------------------------------------------------------------

HEAD = "sentence_classification_head"


def caption_rows():
    """Multi30k training captions labelled "dog" (mentions a dog) or "other", alternating."""
    import gzip
    import re

    require_shared_data(MULTI30K)
    with gzip.open(MULTI30K / "train.en.gz", "rt", encoding="utf-8") as f:
        captions = [line.strip() for line in f if line.strip()]
    dog = re.compile(r"\bdogs?\b", re.IGNORECASE)
    pools = ([c for c in captions if dog.search(c)][:48], [c for c in captions if not dog.search(c)][:48])
    return [(pools[i % 2][i // 2], ("dog", "other")[i % 2]) for i in range(96)]


@pytest.fixture(scope="module")
@trains
def finetuned_export(pretrained_export, tmp_path_factory):
    """The pre-trained checkpoint fine-tuned for 10 updates with --task sentence_prediction
    on 64 captions (prepare_finetune_data.py), exported with --data the fine-tuning dir."""
    from test_bert_finetune_hub import finetune

    from realformer_tools.cli import prepare_finetune_data

    checkpoint, data = pretrained_export[:2]
    root = tmp_path_factory.mktemp("hf_finetuned")
    rows = caption_rows()
    for split, part in (("train", rows[:64]), ("valid", rows[64:])):
        (root / f"{split}.tsv").write_text("".join(f"{t}\t{label}\n" for t, label in part), encoding="utf-8")
    captions = root / "captions"
    assert prepare_finetune_data.main(["--pretrained-data", str(data), "--train", str(root / "train.tsv"),
                                       "--valid", str(root / "valid.tsv"), "--out", str(captions)]) == 0
    finetune(captions, checkpoint, root / "ft", "--num-classes", 2)
    out = root / "hf"
    proc = export_cli(root / "ft" / "checkpoint_last.pt", "--out", out, "--data", captions,
                      "--sentencepiece-model", data / "spm.model")
    return root / "ft" / "checkpoint_last.pt", captions, data, out, json.loads(proc.stdout), rows[64:]


def test_finetuned_head_exports_with_fairseqs_predict_logits(finetuned_export):
    from fairseq.data import Dictionary

    from realformer_nmt.models.realformer_bert import RealFormerBertModel

    checkpoint, captions, data, folder, summary, valid = finetuned_export
    assert summary["classification_head"] == HEAD and summary["heads"]["sequence_classification"] == HEAD
    assert summary["verified"]["max_abs_diff"][HEAD] < ATOL
    config = json.loads((folder / "config.json").read_text())
    labels = Dictionary.load(str(captions / "label" / "dict.txt"))
    assert config["architectures"] == ["RealFormerForSequenceClassification"]
    assert config["id2label"] == {str(i): labels[i + labels.nspecial] for i in range(2)}
    hub = RealFormerBertModel.from_pretrained(str(checkpoint.parent), checkpoint_file=checkpoint.name,
                                              data_name_or_path=str(captions), bpe="sentencepiece",
                                              sentencepiece_model=str(data / "spm.model")).eval()
    texts = [t for t, _ in valid]
    with torch.no_grad():
        want = torch.cat([hub.predict(HEAD, hub.encode(t), return_logits=True) for t in texts]).double()
        log_probs = torch.cat([hub.predict(HEAD, hub.encode(t)) for t in texts]).double()
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    model = AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True).eval()
    enc = tokenizer(texts, padding=True, return_tensors="pt")
    assert (enc["attention_mask"] == 0).any()
    with torch.no_grad():
        got = model(**enc).logits.double()
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    torch.testing.assert_close(got.log_softmax(-1), log_probs, atol=ATOL, rtol=0)
    head = hub.model.classification_heads[HEAD]
    assert torch.equal(model.classifier.weight, head.out_proj.weight)
    assert torch.equal(model.realformer.pooler.dense.weight, head.dense.weight)
    # the classifier trains with fairseq's --pooler-dropout, not BERT's hidden dropout
    assert config["classifier_dropout"] == hub.model.args.pooler_dropout != config["hidden_dropout_prob"]
    assert model.dropout.p == hub.model.args.pooler_dropout
    classify = pipeline("text-classification", model=str(folder), trust_remote_code=True)
    assert [r["label"] for r in classify(texts[:6])] == [config["id2label"][str(i)]
                                                         for i in want[:6].argmax(-1).tolist()]


def test_a_finetune_exports_with_the_pretraining_dir_and_refuses_head_ambiguity(finetuned_export, tmp_path):
    from realformer_nmt.errors import ConfigError

    checkpoint, captions, data, folder = finetuned_export[:4]
    # --data the pre-training dir: its spm.model, and the fine-tuning dir recorded in the checkpoint
    proc = export_cli(checkpoint, "--out", tmp_path / "hf", "--data", data)
    assert json.loads(proc.stdout)["classification_head"] == HEAD
    assert (tmp_path / "hf" / "model.safetensors").read_bytes() == (folder / "model.safetensors").read_bytes()
    hub, _, _ = hf_export.load_hub(str(checkpoint), str(captions))
    hub.model.register_classification_head("other_head", num_classes=3)
    with pytest.raises(ConfigError, match=rf"2 classification heads \(other_head, {HEAD}\) .* pass --head NAME"):
        hf_export.classification_head(hub.model)
    assert hf_export.classification_head(hub.model, "other_head") == "other_head"
    with pytest.raises(ConfigError, match=f"--head nope: the checkpoint's classification heads are other_head, {HEAD}"):
        hf_export.classification_head(hub.model, "nope")


def test_the_finetuned_card_lists_the_classes_that_load_trained_weights(finetuned_export, pretrained_export):
    """A fine-tune: its labels and examples, the pre-training text, the masked-LM head
    among the trained weights, sequence classification listed once, and multiple choice
    loading only with ignore_mismatched_sizes (BERT's rule for a classifier of another shape)."""
    checkpoint, captions, data, folder, summary, valid = finetuned_export
    card = read_card(folder)
    labels = json.loads((folder / "config.json").read_text())["id2label"].values()
    assert "# RealFormer text classifier (" + ", ".join(labels) + "), fine-tuned with fairseq" in card
    assert f"the data dir `{captions.name}`: 64 train, {len(valid)} valid texts" in card
    pretrained = pretrained_export[0]
    assert f"starting from `{pretrained.parent.name}/{pretrained.name}`" in card
    assert "**Pre-training text**: WikiText-2" in card
    assert "| `AutoModelForMaskedLM` | encoder, masked-LM head (pre-training's) | — |" in card
    assert card.count("| `AutoModelForSequenceClassification` |") == 1
    assert "AutoModelForSequenceClassification.from_pretrained(path" in card
    assert "ignore_mismatched_sizes=True" in card.split("| `AutoModelForMultipleChoice` |")[1].splitlines()[0]
    assert summary["training"]["finetune_data"]["examples"] == {"train": 64, "valid": len(valid)}
