"""Export a fairseq ``realformer_bert`` checkpoint to a Hugging Face ``transformers`` folder.

``export(checkpoint, out_dir)`` writes ``config.json`` (``model_type`` "realformer",
``auto_map`` to the two code files), ``model.safetensors``, the tokenizer files and
``configuration_realformer.py`` + ``modeling_realformer.py`` (the package's ``hf/`` files,
copied verbatim: torch and ``transformers`` only), so that
``AutoModelForMaskedLM.from_pretrained(out_dir, trust_remote_code=True)`` (or
``AutoModel``, ``AutoModelForPreTraining``, ``AutoModelForSequenceClassification``)
computes what the fairseq model computes.

* ``checkpoint``: a checkpoint file, or a folder holding ``model.pt`` (what
  ``scripts/convert_google_checkpoint.py`` writes).
* Vocabulary: a converted Google checkpoint (``vocab.txt`` next to it) keeps BERT's
  WordPiece ids (the rows are permuted back from fairseq's dictionary order) and gets
  ``BertTokenizerFast`` over that ``vocab.txt``, lower-casing as the vocabulary says. A
  model pre-trained here (fairseq dictionary over SentencePiece pieces) keeps fairseq's
  ids and gets a fast tokenizer built from ``spm.model`` whose ids are the dictionary's;
  the export checks it against fairseq's own encoding and refuses, in one line, a
  dictionary that it cannot reproduce exactly.
* Heads: the LM head, and the ``next_sentence`` classification head as BERT's pooler +
  NSP classifier (class order flipped to BERT's: 0 = is next).
"""

import json
import logging
import os
import shutil
from typing import Callable, Dict, List, Optional

import torch

from ...errors import CheckpointFileError, ConfigError
from .google_checkpoint import MASK, SPECIALS

logger = logging.getLogger(__name__)

NSP_HEAD = "next_sentence"
ACTIVATIONS = {"gelu": "gelu", "gelu_accurate": "gelu_new", "gelu_fast": "gelu_new", "relu": "relu",
               "tanh": "tanh", "linear": "linear"}
AUTO_MAP = {
    "AutoConfig": "configuration_realformer.RealFormerConfig",
    "AutoModel": "modeling_realformer.RealFormerModel",
    "AutoModelForMaskedLM": "modeling_realformer.RealFormerForMaskedLM",
    "AutoModelForPreTraining": "modeling_realformer.RealFormerForPreTraining",
    "AutoModelForSequenceClassification": "modeling_realformer.RealFormerForSequenceClassification",
}
# checked against fairseq's encoding (with the data's own valid text, when present)
SAMPLE_TEXT = [
    "The film was released in 2001 .",
    "Hello , world ! It 's a small test : 3.5 % of 1,000 people ( roughly ) agreed .",
    "RealFormer adds the previous layer 's attention scores to its own .",
    "  leading and  double   spaces , tabs\tand UPPER case Words",
    "Zürich , São Paulo and Kraków are cities ; naïve café .",
]


def hf_code_dir() -> str:
    from . import hf
    return hf.HERE


def _import_hf():
    try:
        import transformers  # noqa: F401
    except ImportError as e:
        raise ConfigError(f"exporting to Hugging Face needs transformers (pip install -e '.[hf]'): {e}") from None
    from .hf import configuration_realformer, modeling_realformer
    return configuration_realformer, modeling_realformer


def _resolve(checkpoint: str):
    """``(folder, file name)`` of the checkpoint."""
    if os.path.isdir(checkpoint):
        path = os.path.join(checkpoint, "model.pt")
        if not os.path.isfile(path):
            raise CheckpointFileError(f"{checkpoint}: a folder without model.pt (give the checkpoint file itself)")
    elif os.path.isfile(checkpoint):
        path = checkpoint
    else:
        raise CheckpointFileError(f"{checkpoint}: no such file or folder")
    return os.path.dirname(os.path.abspath(path)), os.path.basename(path)


def _model_name(state: dict, path: str) -> str:
    cfg = state.get("cfg")
    model_cfg = cfg.get("model") if cfg is not None else None
    if model_cfg is not None:
        name = model_cfg.get("_name") if hasattr(model_cfg, "get") else getattr(model_cfg, "_name", None)
        if name is None:
            name = getattr(model_cfg, "arch", None)
    else:
        args = state.get("args")
        name = getattr(args, "arch", None) if args is not None else None
    if name is None:
        raise CheckpointFileError(f"{path}: not a fairseq checkpoint (no model configuration)")
    return str(name)


def check_realformer_bert(path: str) -> dict:
    """The checkpoint's contents; a one-line error unless it is a ``realformer_bert`` model."""
    from fairseq import checkpoint_utils
    from fairseq.models import ARCH_MODEL_REGISTRY

    from .model import RealFormerBertModel

    try:
        state = checkpoint_utils.load_checkpoint_to_cpu(path)
    except Exception as e:  # noqa: BLE001  (torch/pickle errors of every kind)
        raise CheckpointFileError(f"{path}: cannot be read as a fairseq checkpoint ({type(e).__name__}: {e})") from None
    name = _model_name(state, path)
    model_class = ARCH_MODEL_REGISTRY.get(name)
    if model_class is None or not issubclass(model_class, RealFormerBertModel):
        raise ConfigError(f"{path}: a '{name}' model, not realformer_bert; only realformer_bert checkpoints "
                          "(encoder pre-training, converted Google checkpoints) export to Hugging Face")
    return state


def _data_dir(folder: str, state: dict, data: Optional[str]) -> str:
    if data is not None:
        candidates = [data]
    else:
        task = (state.get("cfg") or {}).get("task") or {}
        stored = task.get("data") if hasattr(task, "get") else None
        candidates = [folder] + ([os.path.join(folder, stored) if not os.path.isabs(stored) else stored]
                                 if stored else [])
    for c in candidates:
        if os.path.isfile(os.path.join(c, "dict.txt")):
            return c
    raise ConfigError(f"no dict.txt in {' or '.join(candidates)}: pass --data DIR, the data dir the model was "
                      "trained on (its dict.txt)")


def load_hub(checkpoint: str, data: Optional[str] = None):
    """The fairseq hub interface of a ``realformer_bert`` checkpoint (eval mode)."""
    from .model import RealFormerBertModel

    folder, name = _resolve(checkpoint)
    state = check_realformer_bert(os.path.join(folder, name))
    data_dir = _data_dir(folder, state, data)
    del state
    hub = RealFormerBertModel.from_pretrained(folder, checkpoint_file=name, data_name_or_path=os.path.abspath(data_dir))
    return hub.eval(), folder, data_dir


# --------------------------------------------------------------------------------------
# configuration and weights
# --------------------------------------------------------------------------------------


def hf_config_values(model) -> dict:
    """``RealFormerConfig`` arguments computing what ``model`` (fairseq) computes; a
    one-line error for options the Hugging Face code does not implement."""
    from fairseq.modules import LearnedPositionalEmbedding

    from .sentence_encoder import IndexPositionalEmbedding

    args = model.args
    se = model.encoder.sentence_encoder
    layers = list(se.layers)
    first = layers[0]
    act = getattr(args, "activation_fn", "gelu")
    unsupported = []
    if act not in ACTIVATIONS:
        unsupported.append(f"--activation-fn {act}")
    pooler_act = getattr(args, "pooler_activation_fn", "tanh")
    if pooler_act not in ACTIVATIONS:
        unsupported.append(f"--pooler-activation-fn {pooler_act}")
    if se.quant_noise is not None or getattr(args, "quant_noise_pq", 0):
        unsupported.append("--quant-noise-pq")
    if any(getattr(layer, "ffn_layernorm", None) is not None or getattr(layer, "w_resid", None) is not None
           for layer in layers):
        unsupported.append("NormFormer options (--scale-fc / --scale-resids)")
    if getattr(args, "encoder_layers_to_keep", None):
        unsupported.append("--encoder-layers-to-keep")
    pos = se.embed_positions
    if isinstance(pos, IndexPositionalEmbedding):
        offset, rows = pos.offset, pos.weight.shape[0]
    elif isinstance(pos, LearnedPositionalEmbedding):
        offset, rows = None, pos.weight.shape[0]
    else:
        unsupported.append("positions that are not learned (--encoder-learned-pos off)")
        offset, rows = None, 0
    if unsupported:
        raise ConfigError(f"the Hugging Face RealFormer code does not implement {', '.join(unsupported)}")
    residual = model.residual
    eps = first.self_attn_layer_norm.eps
    return dict(
        hidden_size=args.encoder_embed_dim,
        num_hidden_layers=len(layers),
        num_attention_heads=first.self_attn.num_heads,
        intermediate_size=first.fc1.out_features,
        hidden_act=ACTIVATIONS[act],
        hidden_dropout_prob=float(args.dropout),
        attention_probs_dropout_prob=float(args.attention_dropout),
        max_position_embeddings=int(rows),
        type_vocab_size=int(getattr(se, "num_segments", 0) or 0),
        layer_norm_eps=float(eps),
        residual_attention="encoder" in residual.paths,
        residual_attention_mode=residual.mode,
        position_offset=offset,
        zero_padding_embeddings=bool(se.zero_padding_embeddings),
        embedding_layer_norm=se.layernorm_embedding is not None,
        normalize_before=bool(first.normalize_before),
        embed_scale=float(se.embed_scale),
        pooler_act=ACTIVATIONS[pooler_act],
        tie_word_embeddings=model.encoder.lm_head.weight is se.embed_tokens.weight,
    )


def hf_state_dict(model, order: List[int]) -> Dict[str, torch.Tensor]:
    """``RealFormerForPreTraining`` weights; Hugging Face id ``i`` is fairseq id ``order[i]``."""
    sd = {k: v.detach().float().clone() for k, v in model.state_dict().items()}
    e = "encoder.sentence_encoder."
    rows = torch.tensor(order, dtype=torch.long)
    out: Dict[str, torch.Tensor] = {}
    h = "realformer."

    def copy(dst, src, *, params=("weight", "bias")):
        for p in params:
            out[f"{dst}.{p}"] = sd[f"{src}.{p}"]

    out[h + "embeddings.word_embeddings.weight"] = sd[e + "embed_tokens.weight"][rows]
    out[h + "embeddings.position_embeddings.weight"] = sd[e + "embed_positions.weight"]
    if e + "segment_embeddings.weight" in sd:
        out[h + "embeddings.token_type_embeddings.weight"] = sd[e + "segment_embeddings.weight"]
    if e + "layernorm_embedding.weight" in sd:
        copy(h + "embeddings.LayerNorm", e + "layernorm_embedding")
    for i in range(len(model.encoder.sentence_encoder.layers)):
        hf, fs = f"{h}encoder.layer.{i}.", f"{e}layers.{i}."
        for name, proj in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj")):
            copy(hf + "attention.self." + name, fs + "self_attn." + proj)
        copy(hf + "attention.output.dense", fs + "self_attn.out_proj")
        copy(hf + "attention.output.LayerNorm", fs + "self_attn_layer_norm")
        copy(hf + "intermediate.dense", fs + "fc1")
        copy(hf + "output.dense", fs + "fc2")
        copy(hf + "output.LayerNorm", fs + "final_layer_norm")
    if e + "layer_norm.weight" in sd:
        copy(h + "encoder.final_layer_norm", e + "layer_norm")
    lm = "encoder.lm_head."
    copy("cls.predictions.transform.dense", lm + "dense")
    copy("cls.predictions.transform.LayerNorm", lm + "layer_norm")
    out["cls.predictions.decoder.weight"] = sd[lm + "weight"][rows]
    out["cls.predictions.bias"] = sd[lm + "bias"][rows]
    head = f"classification_heads.{NSP_HEAD}."
    if head + "dense.weight" in sd and sd[head + "out_proj.weight"].shape[0] == 2:
        copy(h + "pooler.dense", head + "dense")
        # fairseq's masked_lm_nsp / the converter: class 1 = is next; BERT: class 0 = is next
        out["cls.seq_relationship.weight"] = sd[head + "out_proj.weight"].flip(0).contiguous()
        out["cls.seq_relationship.bias"] = sd[head + "out_proj.bias"].flip(0).contiguous()
    return out


# --------------------------------------------------------------------------------------
# vocabulary and tokenizer
# --------------------------------------------------------------------------------------


def google_order(vocab: List[str], dictionary) -> List[int]:
    """Hugging Face (WordPiece) id ``i`` -> fairseq id, through the token strings."""
    names = dict(SPECIALS + (MASK,))
    order = []
    for i, token in enumerate(vocab):
        symbol = names.get(token, token)
        j = dictionary.index(symbol)
        if j == dictionary.unk() and symbol != "<unk>":
            raise ConfigError(f"vocab.txt line {i + 1}: {token!r} is not in the model's dictionary")
        order.append(j)
    if len(set(order)) != len(order) or len(order) != len(dictionary):
        raise ConfigError(f"vocab.txt ({len(vocab)} tokens) does not map one-to-one onto the model's dictionary "
                          f"({len(dictionary)} symbols)")
    return order


def _read_vocab(path: str) -> List[str]:
    with open(path, encoding="utf-8") as f:
        vocab = [line.rstrip("\n").rstrip("\r") for line in f]
    while vocab and vocab[-1] == "":
        vocab.pop()
    return vocab


def write_wordpiece_tokenizer(vocab: List[str], out_dir: str, max_length: int):
    """``BertTokenizerFast`` over BERT's ``vocab.txt`` (lower-casing as the vocabulary says)."""
    from transformers import BertTokenizerFast

    from ...data.wordpiece import is_uncased

    with open(os.path.join(out_dir, "vocab.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(vocab) + "\n")
    # from_pretrained(folder), not BertTokenizerFast(vocab_file=...): the latter maps every word to [UNK]
    tokenizer = BertTokenizerFast.from_pretrained(out_dir, do_lower_case=is_uncased(vocab),
                                                  model_max_length=max_length)
    tokenizer.save_pretrained(out_dir)
    return tokenizer


def sentencepiece_tokenizer(spm_model: str, dictionary, bert_pairs: bool, max_length: int):
    """A fast tokenizer over ``spm_model`` whose ids are ``dictionary``'s (fairseq's
    ``<s> pieces </s>``; pairs as the hub lays them out). One-line error when the
    dictionary cannot be reproduced: a model type other than BPE or unigram, or a piece
    SentencePiece can produce that the dictionary lacks."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE, Unigram
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import import_protobuf

    try:
        model_pb2 = import_protobuf()
    except ImportError as e:
        raise ConfigError(f"reading {spm_model} needs protobuf (pip install -e '.[hf]'): {e}") from None
    proto = model_pb2.ModelProto()
    with open(spm_model, "rb") as f:
        proto.ParseFromString(f.read())
    kind = proto.trainer_spec.model_type  # 1 unigram, 2 bpe
    if kind not in (1, 2):
        raise ConfigError(f"{spm_model}: SentencePiece model type {kind} (only unigram and BPE export)")
    if proto.trainer_spec.byte_fallback:
        raise ConfigError(f"{spm_model}: byte fallback is not reproducible through fairseq's dictionary")
    normal = [(p.piece, p.score) for p in proto.pieces if p.type in (1, 4)]  # NORMAL, USER_DEFINED
    symbols = [dictionary[i] for i in range(len(dictionary))]
    index = {s: i for i, s in enumerate(symbols)}
    missing = [p for p, _ in normal if p not in index and p != "<unk>"]
    if missing:
        raise ConfigError(f"the dictionary lacks {len(missing)} of {spm_model}'s pieces (e.g. {missing[:3]}): "
                          "fairseq maps them to <unk>, which no tokenizer over the pieces reproduces "
                          "(prepare the data with scripts/prepare_pretraining_data.py --full-vocabulary "
                          "before training)")
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    score = {p: s for p, s in normal}
    floor = min(score.values(), default=0.0) - 1e6
    if kind == 1:
        vocab = [(s, score.get(s, floor)) for s in symbols]
        model = Unigram(vocab, unk_id=dictionary.unk(), byte_fallback=False)
    else:
        from transformers.convert_slow_tokenizer import generate_merges

        # SentencePiece's BPE merges in the order of its pieces (transformers' own conversion)
        ranks = {p.piece: i for i, p in enumerate(proto.pieces) if p.type == 1}
        merges = generate_merges(ranks)
        # ignore_merges: a user-defined symbol (split off below) is one piece, never merged
        model = BPE({s: i for i, s in enumerate(symbols)}, merges, unk_token="<unk>", fuse_unk=True,
                    byte_fallback=False, ignore_merges=True)
    tok = Tokenizer(model)
    spec = proto.normalizer_spec
    parts = [normalizers.Precompiled(spec.precompiled_charsmap)] if spec.precompiled_charsmap else []
    if spec.remove_extra_whitespaces:
        parts.append(normalizers.Replace(Regex(" {2,}"), " "))
    if parts:
        tok.normalizer = normalizers.Sequence(parts)
    # "first": no word boundary after a special token ("<unk>s" -> <unk> s, as SentencePiece)
    prepend = "first" if spec.add_dummy_prefix else "never"
    split = bool(proto.trainer_spec.split_by_whitespace)
    steps = [pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme=prepend, split=split)]
    # SentencePiece's user-defined symbols (WikiText's literal "<unk>") are whole pieces wherever
    # they stand, after the word-boundary mark: "<unk> a" -> "\u2581" "<unk>" "\u2581a"
    user_defined = [p.piece for p in proto.pieces if p.type == 4]
    steps += [pre_tokenizers.Split(u, behavior="isolated") for u in user_defined]
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme=prepend, split=split)
    bos, eos = ("<s>", dictionary.bos()), ("</s>", dictionary.eos())
    pair = "<s> $A:0 </s>:0 $B:1 </s>:1" if bert_pairs else "<s> $A </s> </s> $B </s>"
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", pair=pair, special_tokens=[bos, eos])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", sep_token="</s>", cls_token="<s>",
        pad_token="<pad>", model_max_length=max_length,
        # not an added token when "<unk>" is a user-defined piece: it must stay in the text for the split above
        **({} if "<unk>" in user_defined else {"unk_token": "<unk>"}),
        # lstrip: "was <mask> in" encodes as fairseq's fill_mask encodes it ("was" <mask> "\u2581in")
        mask_token=AddedToken("<mask>", lstrip=True, rstrip=False, special=True, normalized=False),
        model_input_names=["input_ids", "token_type_ids", "attention_mask"] if bert_pairs
        else ["input_ids", "attention_mask"],
    )
    for s in specials:
        if fast.convert_tokens_to_ids(s) != index.get(s):
            raise ConfigError(f"special token {s} has id {fast.convert_tokens_to_ids(s)} in the tokenizer, "
                              f"{index.get(s)} in the dictionary")
    return fast


def _valid_text(data_dir: str, hub, limit: int = 200) -> List[str]:
    """Up to ``limit`` sentences of the data's valid split, decoded back to text."""
    from fairseq.data import data_utils

    path = os.path.join(data_dir, "valid")
    if not os.path.isfile(path + ".idx"):
        return []
    dataset = data_utils.load_indexed_dataset(path, hub.task.source_dictionary)
    texts = []
    for i in range(min(limit, len(dataset))):
        pieces = hub.task.source_dictionary.string(dataset[i])
        if pieces.strip():
            texts.append(hub.bpe.decode(pieces))
    return texts


def check_tokenizer(tokenizer, hub, texts: List[str]) -> int:
    """One-line error at the first text whose ids differ from fairseq's ``hub.encode``."""
    for text in texts:
        theirs = hub.encode(text).tolist()
        ours = tokenizer(text)["input_ids"]
        if ours != theirs:
            raise ConfigError(f"the exported tokenizer would encode {text[:60]!r} as {ours[:12]}..., "
                              f"fairseq as {theirs[:12]}...: refusing to export a tokenizer that differs")
    return len(texts)


# --------------------------------------------------------------------------------------
# export
# --------------------------------------------------------------------------------------


def export(checkpoint: str, out_dir: str, data: Optional[str] = None, sentencepiece_model: Optional[str] = None,
           log: Callable[[str], None] = logger.info) -> dict:
    """Write the Hugging Face folder ``out_dir``; returns a summary (also ``export.json``)."""
    configuration, modeling = _import_hf()
    hub, folder, data_dir = load_hub(checkpoint, data)
    log(f"[1/4] loaded {checkpoint} (dictionary: {os.path.join(data_dir, 'dict.txt')})")
    model, dictionary = hub.model, hub.task.source_dictionary
    values = hf_config_values(model)
    max_length = values["max_position_embeddings"] - (
        0 if values["position_offset"] is not None else dictionary.pad() + 1)

    vocab_file = os.path.join(folder, "vocab.txt")
    google = os.path.isfile(vocab_file)
    if google:
        vocab = _read_vocab(vocab_file)
        order = google_order(vocab, dictionary)
        names = dict(SPECIALS + (MASK,))
        ids = {f: vocab.index(b) for b, f in names.items()}
    else:
        order = list(range(len(dictionary)))
        ids = {s: dictionary.index(s) for s in ("<s>", "<pad>", "</s>", "<unk>", "<mask>")}
    config = configuration.RealFormerConfig(
        vocab_size=len(order), pad_token_id=ids["<pad>"], bos_token_id=ids["<s>"], eos_token_id=ids["</s>"],
        architectures=["RealFormerForPreTraining"], auto_map=dict(AUTO_MAP), **values,
    )
    log(f"[2/4] mapping {sum(p.numel() for p in model.parameters())} parameters "
        f"(residual attention: {config.residual_attention_mode if config.residual_attention else 'off'})")
    state = hf_state_dict(model, order)
    hf_model = modeling.RealFormerForPreTraining(config).eval()
    missing, unexpected = hf_model.load_state_dict(state, strict=False)
    tied = {"cls.predictions.decoder.weight"} if config.tie_word_embeddings else set()
    fresh = sorted(set(missing) - tied)
    allowed = {"realformer.pooler.dense.weight", "realformer.pooler.dense.bias",
               "cls.seq_relationship.weight", "cls.seq_relationship.bias"}
    if unexpected or set(fresh) - allowed:  # a mapping bug, not a user error
        raise RuntimeError(f"weights do not cover the model: unexpected {unexpected}, missing {fresh}")
    if fresh:
        log(f"no {NSP_HEAD} head in the checkpoint: the pooler and NSP classifier start fresh")
    if config.tie_word_embeddings:
        hf_model.tie_weights()

    log(f"[3/4] writing {out_dir}")
    os.makedirs(out_dir, exist_ok=True)
    hf_model.save_pretrained(out_dir)
    for name in ("configuration_realformer.py", "modeling_realformer.py"):
        shutil.copyfile(os.path.join(hf_code_dir(), name), os.path.join(out_dir, name))

    log("[4/4] tokenizer")
    if google:
        write_wordpiece_tokenizer(vocab, out_dir, max_length)
        tokenizer_kind, checked = "BertTokenizerFast (vocab.txt)", 0
    else:
        spm_model = sentencepiece_model or os.path.join(data_dir, "spm.model")
        if not os.path.isfile(spm_model):
            raise ConfigError(f"no SentencePiece model {spm_model}: pass --sentencepiece-model (the data's spm.model)")
        bert_pairs = config.type_vocab_size > 0
        tokenizer = sentencepiece_tokenizer(spm_model, dictionary, bert_pairs, max_length)
        from fairseq.data.encoders.sentencepiece_bpe import SentencepieceBPE, SentencepieceConfig

        hub.bpe = SentencepieceBPE(SentencepieceConfig(sentencepiece_model=spm_model))
        checked = check_tokenizer(tokenizer, hub, SAMPLE_TEXT + _valid_text(data_dir, hub))
        tokenizer.save_pretrained(out_dir)
        tokenizer_kind = f"PreTrainedTokenizerFast ({os.path.basename(spm_model)}, fairseq dictionary ids)"
    summary = {
        "checkpoint": os.path.abspath(os.path.join(folder, _resolve(checkpoint)[1])),
        "out": os.path.abspath(out_dir),
        "model_type": "realformer",
        "residual_attention_mode": config.residual_attention_mode,
        "residual_attention": config.residual_attention,
        "vocab_size": config.vocab_size,
        "tokenizer": tokenizer_kind,
        "tokenizer_texts_checked": checked,
        "heads": {"masked_lm": True, NSP_HEAD: not fresh},
        "classes": sorted(AUTO_MAP),
    }
    with open(os.path.join(out_dir, "export.json"), "w", encoding="utf-8") as f:
        f.write(json.dumps(summary, indent=2) + "\n")
    return summary
