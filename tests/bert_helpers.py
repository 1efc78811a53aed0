"""Shared pieces of the BERT-style (encoder-only) tests: tiny models, the prepared
WikiText-2 data (built once per test session), a plain reference of the encoder, and
the fairseq-train flags of a tiny pre-training run."""

import argparse
import json
import math
import re
import shutil
import types

import paper_reference as paper
import torch
import torch.nn.functional as F
from conftest import REPO, USER_DIR, WIKITEXT2, require_shared_data  # noqa: F401  (re-exported for the BERT tests)
from fairseq.data import Dictionary
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

TEST_VOCAB = 400  # small: SentencePiece and the softmax stay fast

TINY_BERT = dict(
    encoder_layers=3, encoder_embed_dim=16, encoder_ffn_embed_dim=32, encoder_attention_heads=4,
    dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, pooler_dropout=0.0,
    max_positions=32,  # explicit: roberta and realformer_bert default differently (tokens_per_sample vs 512)
)

# fairseq-train flags of a tiny, fast pre-training / fine-tuning run (dims must match
# between the two, since fine-tuning restores the pre-trained weights)
TINY_BERT_FLAGS = (
    "--encoder-layers 2 --encoder-embed-dim 32 --encoder-ffn-embed-dim 64 --encoder-attention-heads 4 "
    "--cpu --no-progress-bar --log-format simple --no-epoch-checkpoints --seed 1 --num-workers 0"
).split()


def bert_dictionary(n=30):
    """A dictionary as the masked-LM tasks build it: specials, n words, then <mask>."""
    d = Dictionary()
    for i in range(n):
        d.add_symbol(f"w{i}")
    d.add_symbol("<mask>")
    return d


def build_bert(arch="realformer_bert", dictionary=None, seed=0, tokens_per_sample=32, tiny=True, **overrides):
    """A model built through fairseq's registries, as fairseq-train builds it
    (``tiny``: TINY_BERT's dims and no dropout; else the architecture's own)."""
    d = dictionary or bert_dictionary()
    task = types.SimpleNamespace(
        source_dictionary=d, target_dictionary=d, max_positions=lambda: tokens_per_sample
    )
    args = argparse.Namespace(**{**(TINY_BERT if tiny else {}), "tokens_per_sample": tokens_per_sample, **overrides})
    ARCH_CONFIG_REGISTRY[arch](args)
    torch.manual_seed(seed)
    return ARCH_MODEL_REGISTRY[arch].build_model(args, task).eval()


def sharpen_attention(model, scores=25.0, values=10.0):
    """Scale the query/key projections (peaked attention) and the value/output ones
    (attention output as large as the residual stream).

    BERT's initialisation (std 0.02) leaves tiny models with near-uniform attention whose
    output is small next to the residual stream, so the residual scores change almost
    nothing; tests comparing residual settings need attention that matters."""
    with torch.no_grad():
        for layer in model.encoder.sentence_encoder.layers:
            attn = layer.self_attn
            for proj, scale in ((attn.q_proj, scores), (attn.k_proj, scores),
                                (attn.v_proj, values), (attn.out_proj, values)):
                proj.weight.mul_(scale)
    return model


def bert_batch(dictionary, bsz=3, length=9, seed=1):
    """``<s> ... </s>`` rows, right-padded as fairseq's masked-LM tasks pad them."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(dictionary.nspecial, len(dictionary) - 1, (bsz, length), generator=g)
    tokens[:, 0] = dictionary.bos()
    tokens[:, -1] = dictionary.eos()
    if bsz > 1:
        tokens[1, length - 3:] = dictionary.pad()
        tokens[1, length - 4] = dictionary.eos()
    return tokens


def reference_features(model, tokens, paths, mode, pre_ln=False):
    """RoBERTa/BERT encoder features written out from the weights: token + learned
    position embeddings, embedding layer norm, then layers of the paper's residual
    attention (``paper_reference.attention``) with a GELU FFN, Post-LN (or Pre-LN)."""
    p = {k: v.detach() for k, v in model.state_dict().items()}
    e = "encoder.sentence_encoder."
    pad = model.encoder.dictionary.pad()
    keep = tokens.ne(pad)
    positions = torch.cumsum(keep, dim=1) * keep + pad  # fairseq's make_positions
    x = F.embedding(tokens, p[e + "embed_tokens.weight"]) + F.embedding(positions, p[e + "embed_positions.weight"])
    if e + "layernorm_embedding.weight" in p:
        x = paper._ln(p, e + "layernorm_embedding", x)
    x = x * keep.unsqueeze(-1).to(x)  # fairseq zeroes padded positions
    heads = model.args.encoder_attention_heads
    key_pad = ~keep if (~keep).any() else None
    prev = None
    for i in range(model.args.encoder_layers):
        layer = paper._sub(p, f"{e}layers.{i}.")
        residual = "encoder" in paths

        def self_attn(h, layer=layer, residual=residual, n=i + 1):
            nonlocal prev
            out, A = paper.attention(paper._sub(layer, "self_attn."), h, h, heads, prev, key_pad,
                                     False, residual, mode, n)
            prev = A
            return out

        def ffn(h, layer=layer):
            h = F.gelu(F.linear(h, layer["fc1.weight"], layer["fc1.bias"]))
            return F.linear(h, layer["fc2.weight"], layer["fc2.bias"])

        x = paper._block(layer, "self_attn_layer_norm", x, self_attn, pre_ln)
        x = paper._block(layer, "final_layer_norm", x, ffn, pre_ln)
    if pre_ln:
        x = paper._ln(p, e + "layer_norm", x)
    return x


# --------------------------------------------------------------------------------------
# The prepared WikiText-2 data dir, built once per session
# --------------------------------------------------------------------------------------

def prepared_wikitext2(tmp_path_factory):
    """The WikiText-2 pre-training data dir (vocabulary ``TEST_VOCAB``) of this session.

    The first caller builds it, later callers (in other test modules) find it finished.
    A folder a failed build left unfinished is removed and built from scratch: no test
    reads data that an earlier failure half wrote. Skips (fails in CI) where the real
    WikiText-2 is missing."""
    from realformer_tools.data import pretraining

    require_shared_data(WIKITEXT2)

    out = tmp_path_factory.getbasetemp() / "wikitext2_bert_bin"
    if pretraining.prepared(str(out)) is None:
        shutil.rmtree(out, ignore_errors=True)
    pretraining.prepare_pretraining(str(WIKITEXT2), str(out), vocab_size=TEST_VOCAB, log=lambda m: None)
    return out


# --------------------------------------------------------------------------------------
# Reading fairseq-train logs (--log-format simple)
# --------------------------------------------------------------------------------------

_FIELD = re.compile(r"(\w+)[= ]([-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf))(?=[ ,]|$)")


def log_records(text, kind):
    """The ``train_inner``, ``valid`` or ``train`` (epoch) lines of a log as dicts."""
    records = []
    for line in text.splitlines():
        if kind == "train_inner" and "| train_inner |" in line:
            body = line.split("| train_inner |", 1)[1]
        elif kind == "valid" and "| valid |" in line and "valid on" in line:
            body = line.split("subset", 1)[1]
        elif kind == "train" and "| train |" in line:
            body = line.split("| train |", 1)[1]
        else:
            continue
        body = body.replace(" | ", " ")
        records.append({k: float(v) for k, v in _FIELD.findall(body)})
    return records


def finite(x):
    return not (math.isnan(x) or math.isinf(x))



# --------------------------------------------------------------------------------------
# A tiny pre-trained checkpoint, shared by the test modules of a session
# --------------------------------------------------------------------------------------

def pretrain_flags(data, save_dir, task="masked_lm_nsp", criterion="masked_lm_nsp",
                   arch="realformer_bert_small", updates=16):
    """fairseq-train arguments of a tiny pre-training run on ``data``."""
    return [
        data, "--user-dir", USER_DIR, "--task", task, "--criterion", criterion, "--arch", arch,
        *TINY_BERT_FLAGS, "--tokens-per-sample", 64, "--batch-size", 8,
        "--optimizer", "adam", "--lr", 1e-3, "--max-update", updates, "--log-interval", 4,
        "--max-valid-steps", 6, "--save-dir", save_dir,
    ]


def pretrained_nsp(tmp_path_factory):
    """(save_dir, log text) of a 16-update ``masked_lm_nsp`` run of ``realformer_bert_small``
    (tiny dims) on the prepared WikiText-2; trained once per session.

    Always a run from scratch: a folder without ``done.json`` (a run that was interrupted)
    is removed first, never resumed; a run that failed is reported again, loudly, to
    every later caller."""
    from inprocess import run_in_process

    data = prepared_wikitext2(tmp_path_factory)
    save = tmp_path_factory.getbasetemp() / "bert_nsp_pretrained"
    done, log = save / "done.json", save / "train.log"
    if not done.exists():
        shutil.rmtree(save, ignore_errors=True)
        proc = run_in_process("fairseq-train", *pretrain_flags(data, save), check=False)
        save.mkdir(parents=True, exist_ok=True)
        log.write_text(proc.stdout + proc.stderr)
        done.write_text(json.dumps({"returncode": proc.returncode}))
    returncode = json.loads(done.read_text())["returncode"]
    if returncode != 0:
        raise AssertionError(f"the shared pre-training run of this session failed (exit code {returncode}, "
                             f"log: {log}):\n{log.read_text()[-3000:]}")
    return save, log.read_text()
