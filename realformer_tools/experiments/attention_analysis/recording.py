"""Reading the model's own attention probabilities: hooks on every attention module
(fairseq's ``MultiheadAttention`` and its subclass ``ResidualMultiheadAttention``) ask for
per-head weights and the probabilities of the layer's own scores and read them from the
module's return value; nothing is recomputed. Also the batch's inputs and masks."""

import contextlib
import functools
import inspect
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch import Tensor

from realformer_nmt.errors import ConfigError

ATTENTION_TYPES = ("encoder_self", "decoder_self", "cross")


def attention_modules(model) -> Dict[str, list]:
    """The model's attention modules by type, in layer order, chosen by model type:
    encoder-decoder models (``transformer``, ``realformer_transformer*``) have
    ``encoder_self``, ``decoder_self`` and ``cross``; encoder-only models (RoBERTa and
    its subclasses, e.g. ``realformer_bert*``) have ``encoder_self`` only."""
    from fairseq.models import FairseqEncoderDecoderModel, FairseqEncoderModel
    from fairseq.modules import MultiheadAttention

    def collect(module):
        return [m for m in module.modules() if isinstance(m, MultiheadAttention)]

    if isinstance(model, FairseqEncoderDecoderModel):
        decoder = collect(model.decoder)
        found = {
            "encoder_self": collect(model.encoder),
            "decoder_self": [m for m in decoder if not m.encoder_decoder_attention],
            "cross": [m for m in decoder if m.encoder_decoder_attention],
        }
    elif isinstance(model, FairseqEncoderModel):
        found = {"encoder_self": collect(model.encoder)}
    else:
        raise ConfigError(
            f"--path: attention analysis supports encoder-decoder and encoder-only models, "
            f"not {type(model).__name__}"
        )
    found = {t: ms for t, ms in found.items() if ms}
    for t, ms in found.items():
        heads = {m.num_heads for m in ms}
        if len(heads) != 1:
            raise ConfigError(f"--path: {t} layers have different head counts {sorted(heads)}; "
                              "adjacent-layer JSD pairs head i with head i")
    return found


def _as_keyword_arguments(module, args, kwargs) -> dict:
    """A call's arguments, positional ones included, as keywords of ``module.forward``."""
    if not args:
        return dict(kwargs)
    sig = inspect.signature(module.forward)
    bound = sig.bind(*args, **kwargs)
    out = {}
    for name, value in bound.arguments.items():
        kind = sig.parameters[name].kind
        if kind is inspect.Parameter.VAR_KEYWORD:
            out.update(value)
        elif kind is inspect.Parameter.VAR_POSITIONAL:
            raise TypeError(f"{type(module).__name__}.forward takes *args; cannot request weights by keyword")
        else:
            out[name] = value
    return out


def _request_head_weights(module, args, kwargs):
    """Pre-hook: ask for per-head weights ``[H, B, T, S]``.

    A module off the residual path (fairseq's own, or ours with the path off) runs
    fairseq's ``MultiheadAttention.forward``, which hands a full pass (no incremental
    state, ``static_kv`` False) to PyTorch's fused kernel, whose weights are averaged
    over heads. Giving it an empty incremental-state dict keeps it on fairseq's own
    materialized path (same projections, masks and softmax; the key/value cache it fills
    is thrown away), which returns per-head weights. Modules on a residual path
    materialize their probabilities whenever weights are requested.
    """
    kwargs = _as_keyword_arguments(module, args, kwargs)
    kwargs["need_weights"] = True
    kwargs["need_head_weights"] = True
    if kwargs.get("incremental_state") is None and not getattr(module, "residual", False):
        kwargs["incremental_state"] = {}
    if getattr(module, "residual", False):
        module.own_weights = None
    return (), kwargs


def _own_score_weights(module, weights: Tensor) -> Tensor:
    """The probabilities of the module's own scores, ``[H, B, T, S]``: what a residual
    module left in ``own_weights`` (see ``need_own_weights``); for any other attention
    module (fairseq's, or ours off the residual path) the weights it attended with,
    which are its own scores' softmax."""
    if not getattr(module, "residual", False):
        return weights
    own, module.own_weights = getattr(module, "own_weights", None), None
    if own is None:
        raise RuntimeError(f"{type(module).__name__} on a residual path returned no own-score probabilities "
                           "(need_own_weights)")
    return own


def _read_head_weights(record: list, own_record: list, layer: int, name: str, consumer, module, args, output):
    """Forward hook: the per-head weights ``[H, B, T, S]`` the module returned, and the
    probabilities of its own scores."""
    weights = output[1] if isinstance(output, tuple) and len(output) > 1 else None
    if weights is None or weights.dim() != 4 or weights.size(0) != module.num_heads:
        shape = None if weights is None else tuple(weights.shape)
        raise RuntimeError(
            f"{name} layer {layer + 1}: {type(module).__name__} returned weights of shape {shape}, "
            "expected per-head [heads, batch, tgt_len, src_len]"
        )
    weights = weights.detach()
    own = _own_score_weights(module, weights)
    if consumer is not None:
        consumer(name, layer, weights, own)
        return
    if record[layer] is not None:
        raise RuntimeError(f"{name} layer {layer + 1} ran twice in one forward pass")
    record[layer] = weights.transpose(0, 1).float()  # [B, H, T, S]
    own_record[layer] = own.transpose(0, 1).float()


@contextlib.contextmanager
def recording_attention(model, consumer: Optional[Callable[[str, int, Tensor, Tensor], None]] = None):
    """Within the block, every forward of ``model`` hands each attention module's
    probabilities to ``consumer(type, layer, weights, own)`` as the layer runs (both
    ``[H, B, T, S]``; ``own``: of the layer's own scores; nothing is kept), or, without a
    consumer, fills ``record[type][layer]`` and ``record.own[type][layer]`` with them as
    ``[B, H, T, S]`` (see :func:`attention_probabilities`)."""
    modules = attention_modules(model)
    record = _Record({t: [None] * len(ms) for t, ms in modules.items()})
    handles, flagged = [], []
    try:
        for t, ms in modules.items():
            for i, m in enumerate(ms):
                if hasattr(m, "need_own_weights"):
                    m.need_own_weights = True
                    flagged.append(m)
                handles.append(m.register_forward_pre_hook(_request_head_weights, with_kwargs=True))
                handles.append(m.register_forward_hook(
                    functools.partial(_read_head_weights, record[t], record.own[t], i, t, consumer)))
        yield record
    finally:
        for h in handles:
            h.remove()
        for m in flagged:
            m.need_own_weights, m.own_weights = False, None


class _Record(dict):
    """``{type: [B, H, T, S] per layer}`` of the attention used; ``own``: the same for
    the layers' own scores."""

    def __init__(self, layers):
        super().__init__(layers)
        self.own = {t: [None] * len(ls) for t, ls in layers.items()}

    def clear_batch(self):
        for record in (self, self.own):
            for layers in record.values():
                layers[:] = [None] * len(layers)

    def complete(self) -> Dict[str, List[Tensor]]:
        for t, layers in self.items():
            missing = [i + 1 for i, p in enumerate(layers) if p is None]
            if missing:
                raise RuntimeError(f"{t}: layers {missing} did not run in the forward pass")
        return {t: list(layers) for t, layers in self.items()}

    def complete_own(self) -> Dict[str, List[Tensor]]:
        self.complete()
        return {t: list(layers) for t, layers in self.own.items()}


def model_inputs(model, sample, pads) -> Tuple[dict, Dict[str, Tuple[Tensor, Tensor]]]:
    """``(forward kwargs, {type: (query_real [B, T], key_real [B, S])})`` for a batch.

    Decoder attention is teacher-forced on the reference (``prev_output_tokens``; the
    decoder builds its causal mask in a full pass)."""
    from fairseq.models import FairseqEncoderDecoderModel

    net_input = dict(sample["net_input"])
    src_real = net_input["src_tokens"].ne(pads["source"])
    masks = {"encoder_self": (src_real, src_real)}
    if isinstance(model, FairseqEncoderDecoderModel):
        tgt_real = net_input["prev_output_tokens"].ne(pads["target"])
        masks["decoder_self"] = (tgt_real, tgt_real)
        masks["cross"] = (tgt_real, src_real)
    return net_input, masks


def forward(model, net_input) -> None:
    """The model's forward pass on a batch (teacher-forced for encoder-decoder models);
    the output itself is not needed."""
    with torch.no_grad():
        model(**net_input, features_only=True)


def attention_probabilities(model, record, net_input, own_scores: bool = False):
    """One forward pass inside :func:`recording_attention` (without a consumer);
    ``{type: [B, H, T, S] per layer}`` of the attention used, or with ``own_scores`` the
    pair ``(used, own)``, ``own`` of the layers' own scores."""
    record.clear_batch()
    forward(model, net_input)
    probs, own = record.complete(), record.complete_own()
    record.clear_batch()
    return (probs, own) if own_scores else probs


def restore_masked_tokens(sample, pad: int) -> bool:
    """Put the original tokens back where a masked-LM task masked or replaced them
    (``target`` holds the original token there, padding elsewhere), so encoders are
    analysed on real text. Returns False when the sample has no such target."""
    src = sample["net_input"]["src_tokens"]
    target = sample.get("target")
    if not torch.is_tensor(target) or target.shape != src.shape:
        return False
    sample["net_input"]["src_tokens"] = torch.where(target.ne(pad), target, src)
    return True
