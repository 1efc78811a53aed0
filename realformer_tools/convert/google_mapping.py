"""Google's RealFormer BERT checkpoints onto fairseq's ``realformer_bert``: the variables a
checkpoint holds (``model_variables``) and where each goes (``fairseq_vocabulary``,
``fairseq_flags``, ``fairseq_state``), from the checkpoint as read (``GoogleCheckpoint``).
``google_checkpoint.py`` reads the checkpoints and writes the converted folder with these
(imports only go that way).
"""

from typing import Dict, List, NamedTuple, Tuple

import numpy as np
import torch

from realformer_nmt.errors import ConfigError
from realformer_nmt.models.realformer_bert.model import GOOGLE_NSP_HEAD

# One encoder layer's parameters: BERT's name (Google's TF checkpoints spell it with "/",
# Hugging Face's with "."), fairseq's name, and whether it is a linear or a layer norm.
BERT_LAYER_NAMES = (
    ("attention/self/query", "self_attn.q_proj", "linear"),
    ("attention/self/key", "self_attn.k_proj", "linear"),
    ("attention/self/value", "self_attn.v_proj", "linear"),
    ("attention/output/dense", "self_attn.out_proj", "linear"),
    ("attention/output/LayerNorm", "self_attn_layer_norm", "norm"),
    ("intermediate/dense", "fc1", "linear"),
    ("output/dense", "fc2", "linear"),
    ("output/LayerNorm", "final_layer_norm", "norm"),
)

VOCAB_FILE = "vocab.txt"


class GoogleCheckpoint(NamedTuple):
    """A released checkpoint as read (``google_checkpoint.read_google_checkpoint``), what the mapping maps."""

    config: dict  # bert_config.json with BertConfig's defaults filled in
    vocab: List[str]
    variables: Dict[str, np.ndarray]  # the model's variables, by TF name
    skipped: Dict[str, int]  # what was left out: optimizer slots, bookkeeping, --ignore-variables
    heads: Dict[str, bool]  # mlm / nsp: present in the checkpoint
    name: str  # the checkpoint's file name prefix


# BERT's specials on fairseq's, in fairseq's order (Dictionary: <s>, <pad>, </s>, <unk> = 0..3)
SPECIALS = (("[CLS]", "<s>"), ("[PAD]", "<pad>"), ("[SEP]", "</s>"), ("[UNK]", "<unk>"))
MASK = ("[MASK]", "<mask>")
ACTIVATIONS = {"gelu": "gelu_accurate", "relu": "relu", "tanh": "tanh"}  # BERT's gelu is the tanh form
LAYER_NORM_EPS = 1e-12  # tf_slim.layers.layer_norm
TABLE1 = {(4, 512, 8, 2048): "small", (12, 768, 12, 3072): "base", (24, 1024, 16, 4096): "large",
          (36, 1536, 24, 6144): "xlarge"}


# --------------------------------------------------------------------------------------
# the variables a checkpoint must (or may) have
# --------------------------------------------------------------------------------------


def model_variables(config: dict) -> Dict[str, Tuple[str, Tuple[int, ...]]]:
    """TF name -> (group, shape) for every variable of ``BertModel`` (groups ``encoder``,
    ``pooler``) and of BERT's pre-training heads (``mlm``, ``nsp``)."""
    h, f, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    out: Dict[str, Tuple[str, Tuple[int, ...]]] = {}

    def dense(group, prefix, n_in, n_out):
        out[prefix + "/kernel"] = (group, (n_in, n_out))
        out[prefix + "/bias"] = (group, (n_out,))

    def norm(group, prefix):
        out[prefix + "/gamma"] = (group, (h,))
        out[prefix + "/beta"] = (group, (h,))

    out["bert/embeddings/word_embeddings"] = ("encoder", (v, h))
    out["bert/embeddings/token_type_embeddings"] = ("encoder", (config["type_vocab_size"], h))
    out["bert/embeddings/position_embeddings"] = ("encoder", (config["max_position_embeddings"], h))
    norm("encoder", "bert/embeddings/LayerNorm")
    for i in range(config["num_hidden_layers"]):
        p = f"bert/encoder/layer_{i}"
        for proj in ("query", "key", "value"):
            dense("encoder", f"{p}/attention/self/{proj}", h, h)
        dense("encoder", f"{p}/attention/output/dense", h, h)
        norm("encoder", f"{p}/attention/output/LayerNorm")
        dense("encoder", f"{p}/intermediate/dense", h, f)
        dense("encoder", f"{p}/output/dense", f, h)
        norm("encoder", f"{p}/output/LayerNorm")
    dense("pooler", "bert/pooler/dense", h, h)
    dense("mlm", "cls/predictions/transform/dense", h, h)
    norm("mlm", "cls/predictions/transform/LayerNorm")
    out["cls/predictions/output_bias"] = ("mlm", (v,))
    out["cls/seq_relationship/output_weights"] = ("nsp", (2, h))
    out["cls/seq_relationship/output_bias"] = ("nsp", (2,))
    return out


# --------------------------------------------------------------------------------------
# mapping onto fairseq
# --------------------------------------------------------------------------------------


def fairseq_vocabulary(vocab: List[str]) -> Tuple[List[str], List[int]]:
    """``(dict.txt symbols, order)``: fairseq id ``j`` is WordPiece id ``order[j]``.

    fairseq's ``Dictionary`` starts with ``<s> <pad> </s> <unk>``; dict.txt lists the rest
    of the vocabulary in its own order, ``[MASK]`` as ``<mask>`` (so that the masked-LM
    tasks find it there instead of appending one)."""
    index = {}
    for i, token in enumerate(vocab):
        if not token or any(c.isspace() for c in token):
            raise ConfigError(f"{VOCAB_FILE} line {i + 1}: {token!r} is empty or holds whitespace")
        if token in index:
            raise ConfigError(f"{VOCAB_FILE} lists {token!r} twice (lines {index[token] + 1} and {i + 1})")
        index[token] = i
    fairseq_names = [f for _, f in SPECIALS] + [MASK[1]]
    clash = [t for t in fairseq_names if t in index]
    if clash:
        raise ConfigError(f"{VOCAB_FILE} holds fairseq's special symbols {', '.join(clash)} as ordinary tokens")
    missing = [b for b, _ in SPECIALS + (MASK,) if b not in index]
    if missing:
        raise ConfigError(f"{VOCAB_FILE} has no {', '.join(missing)}: BERT's special tokens are needed")
    specials = [index[b] for b, _ in SPECIALS]
    rest = [i for i in range(len(vocab)) if i not in set(specials)]
    symbols = [MASK[1] if vocab[i] == MASK[0] else vocab[i] for i in rest]
    return symbols, specials + rest


def fairseq_flags(config: dict) -> List[str]:
    """The fairseq model flags that compute what ``bert_config.json`` describes."""
    return [
        "--arch", "realformer_bert_google",
        "--encoder-layers", str(config["num_hidden_layers"]),
        "--encoder-embed-dim", str(config["hidden_size"]),
        "--encoder-attention-heads", str(config["num_attention_heads"]),
        "--encoder-ffn-embed-dim", str(config["intermediate_size"]),
        "--max-positions", str(config["max_position_embeddings"]),
        "--num-segments", str(config["type_vocab_size"]),
        "--position-offset", "0",
        "--layer-norm-eps", repr(LAYER_NORM_EPS),
        "--activation-fn", ACTIVATIONS[config["hidden_act"]],
        "--dropout", repr(float(config["hidden_dropout_prob"])),
        "--attention-dropout", repr(float(config["attention_probs_dropout_prob"])),
        "--residual-attention-paths", "encoder",
        "--residual-attention-mode", "mean" if config["use_running_mean"] else "sum",
    ]


def finetune_arch_flags(config: dict) -> List[str]:
    """The shortest fairseq-train flags for the same model: a ``realformer_bert_google_*``
    arch when the sizes are one of Table 1's, plus what differs from its defaults."""
    flags = fairseq_flags(config)
    value = dict(zip(flags[::2], flags[1::2]))
    size = TABLE1.get((config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"],
                       config["intermediate_size"]))
    out = ["--arch", f"realformer_bert_google_{size}"] if size else flags[:10]
    defaults = {"--max-positions": "512", "--num-segments": "2", "--activation-fn": "gelu_accurate",
                "--dropout": "0.1", "--attention-dropout": "0.1"}
    for flag, default in defaults.items():
        if value[flag] != default:
            out += [flag, value[flag]]
    return out + ["--residual-attention-mode", value["--residual-attention-mode"]]


def fairseq_state(ckpt: GoogleCheckpoint, order: List[int]) -> Dict[str, torch.Tensor]:
    """The converted weights under fairseq's parameter names."""
    v = ckpt.variables
    state: Dict[str, torch.Tensor] = {}

    def put(name, array):
        state[name] = torch.from_numpy(np.ascontiguousarray(array, dtype=np.float32))

    def linear(fs, tf_prefix):
        put(fs + ".weight", v[tf_prefix + "/kernel"].T)  # TF kernels are [in, out]
        put(fs + ".bias", v[tf_prefix + "/bias"])

    def norm(fs, tf_prefix):
        put(fs + ".weight", v[tf_prefix + "/gamma"])
        put(fs + ".bias", v[tf_prefix + "/beta"])

    e = "encoder.sentence_encoder."
    words = v["bert/embeddings/word_embeddings"][order]
    put(e + "embed_tokens.weight", words)
    put(e + "embed_positions.weight", v["bert/embeddings/position_embeddings"])
    put(e + "segment_embeddings.weight", v["bert/embeddings/token_type_embeddings"])
    norm(e + "layernorm_embedding", "bert/embeddings/LayerNorm")
    for i in range(ckpt.config["num_hidden_layers"]):
        fs, tf = f"{e}layers.{i}.", f"bert/encoder/layer_{i}/"
        for bert, fairseq_name, kind in BERT_LAYER_NAMES:
            (linear if kind == "linear" else norm)(fs + fairseq_name, tf + bert)
    if ckpt.heads["mlm"]:
        linear("encoder.lm_head.dense", "cls/predictions/transform/dense")
        norm("encoder.lm_head.layer_norm", "cls/predictions/transform/LayerNorm")
        put("encoder.lm_head.weight", words)  # tied to the word embeddings, as in BERT
        put("encoder.lm_head.bias", v["cls/predictions/output_bias"][order])
    if ckpt.heads["nsp"]:
        head = f"classification_heads.{GOOGLE_NSP_HEAD}."
        linear(head + "dense", "bert/pooler/dense")
        # BERT: class 0 = is next; masked_lm_nsp (nsp_target): class 1 = is next
        put(head + "out_proj.weight", v["cls/seq_relationship/output_weights"][::-1])
        put(head + "out_proj.bias", v["cls/seq_relationship/output_bias"][::-1])
    return state
