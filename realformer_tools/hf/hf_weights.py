"""The configuration and weights of a Hugging Face export (``hf_export.py``): what a
fairseq ``realformer_bert`` model computes, as ``RealFormerConfig`` values and the
``RealFormerFor*`` parameter names.

Heads: the LM head (``cls.predictions``), and at most one of the checkpoint's
classification heads. The ``next_sentence`` head (pre-training's) becomes BERT's pooler +
NSP classifier (``cls.seq_relationship``, class order flipped to BERT's: 0 = is next); any
other head (a ``sentence_prediction`` fine-tune's ``sentence_classification_head``)
becomes the pooler + ``classifier`` of ``RealFormerForSequenceClassification``
(fairseq's RoBERTa head is dense -> activation -> out_proj on the first token, which is
BERT's pooler -> classifier). Both use the pooler, so a checkpoint with several heads
exports the one ``--head`` names.
"""

from typing import Dict, List, Optional

import torch

from realformer_nmt.errors import ConfigError
from realformer_nmt.models.realformer_bert.model import GOOGLE_NSP_HEAD

from ..convert.google_mapping import BERT_LAYER_NAMES

NSP_HEAD = GOOGLE_NSP_HEAD  # fairseq's pre-training head; also where converted Google checkpoints keep it
ACTIVATIONS = {"gelu": "gelu", "gelu_accurate": "gelu_new", "gelu_fast": "gelu_new", "relu": "relu",
               "tanh": "tanh", "linear": "linear"}


def hf_config_values(model) -> dict:
    """``RealFormerConfig`` arguments computing what ``model`` (fairseq) computes; a
    one-line error for options the Hugging Face code does not implement."""
    from fairseq.modules import LearnedPositionalEmbedding

    from realformer_nmt.models.realformer_bert.sentence_encoder import IndexPositionalEmbedding

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
    if model.residual.value_paths:  # the exported modeling code has no value residual
        unsupported.append(f"--value-residual-paths {','.join(sorted(model.residual.value_paths))} "
                           f"(value residual, --value-residual-mix {model.residual.value_mix})")
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


def classification_head(model, name: Optional[str] = None) -> Optional[str]:
    """The classification head to export: ``name`` (``--head``), or the checkpoint's only
    one, or None when it has none; a one-line error for an unknown name or a choice to make."""
    heads = sorted(getattr(model, "classification_heads", None) or {})
    if name is not None:
        if name not in heads:
            raise ConfigError(f"--head {name}: the checkpoint's classification heads are "
                              f"{', '.join(heads) if heads else 'none'}")
        return name
    if len(heads) > 1:
        raise ConfigError(f"the checkpoint has {len(heads)} classification heads ({', '.join(heads)}) and the "
                          "exported model one pooler: pass --head NAME to choose the one exported")
    return heads[0] if heads else None


def head_kind(model, name: Optional[str]) -> Optional[str]:
    """``"next_sentence"`` (pooler + NSP classifier), ``"sequence_classification"``
    (pooler + classifier) or None; a one-line error for a head BERT's layout cannot hold."""
    if name is None:
        return None
    head = model.classification_heads[name]
    hidden = model.args.encoder_embed_dim
    if not isinstance(head.dense, torch.nn.Linear) or head.dense.out_features != hidden:
        raise ConfigError(f"classification head {name}: an inner dimension of {head.dense.out_features}, "
                          f"not the hidden size {hidden} that BERT's pooler has")
    if any(n.endswith("_orig") for n, _ in head.named_parameters()):
        raise ConfigError(f"classification head {name}: spectral normalization does not export")
    two = head.out_proj.out_features == 2
    return "next_sentence" if name == NSP_HEAD and two else "sequence_classification"


def hf_state_dict(model, order: List[int], head: Optional[str] = None) -> Dict[str, torch.Tensor]:
    """The exported weights (``RealFormerFor*`` names); Hugging Face id ``i`` is fairseq id
    ``order[i]``. The decoder's weight is left out when tied to the word embeddings."""
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
        for bert, fairseq_name, _ in BERT_LAYER_NAMES:
            copy(hf + bert.replace("/", "."), fs + fairseq_name)
    if e + "layer_norm.weight" in sd:
        copy(h + "encoder.final_layer_norm", e + "layer_norm")
    lm = "encoder.lm_head."
    copy("cls.predictions.transform.dense", lm + "dense")
    copy("cls.predictions.transform.LayerNorm", lm + "layer_norm")
    if model.encoder.lm_head.weight is not model.encoder.sentence_encoder.embed_tokens.weight:
        out["cls.predictions.decoder.weight"] = sd[lm + "weight"][rows]
    out["cls.predictions.bias"] = sd[lm + "bias"][rows]
    kind = head_kind(model, head)
    if kind is not None:
        src = f"classification_heads.{head}."
        copy(h + "pooler.dense", src + "dense")
        if kind == "next_sentence":
            # fairseq's masked_lm_nsp / the converter: class 1 = is next; BERT: class 0 = is next
            out["cls.seq_relationship.weight"] = sd[src + "out_proj.weight"].flip(0).contiguous()
            out["cls.seq_relationship.bias"] = sd[src + "out_proj.bias"].flip(0).contiguous()
        else:
            copy("classifier", src + "out_proj")
    return {k: v.contiguous() for k, v in out.items()}
