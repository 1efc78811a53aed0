"""``ResidualMultiheadAttention``: fairseq's ``MultiheadAttention`` that takes the previous layer's
:class:`ResidualState` and leaves its own in the caller's :class:`ResidualPath`."""

import logging
from typing import Dict, Optional, Tuple

import torch
from fairseq.modules import MultiheadAttention
from torch import Tensor

from ..dropout_names import use_fairseq_dropout_names
from . import choice
from .bias import BiasKernel
from .choice import KERNELS
from .masks import MaskFacts
from .materialized import MaterializedKernel
from .state import RESIDUAL_MODES, ResidualPath, ResidualState, divisor
from .triton_kernel import TritonFailed, TritonKernel, failure_line, note_fallback, unsupported
from .value_residual import ValueResidual

IncrementalState = Dict[str, Dict[str, Optional[Tensor]]]

logger = logging.getLogger(__name__)


def new_keys_padding(key_padding_mask: Optional[Tensor], query: Tensor, key: Optional[Tensor],
                     incremental_state, static_kv: bool, self_attention: bool) -> Optional[Tensor]:
    """The padding mask fairseq's own forward takes, from ours (which covers the cached keys too):
    in step-by-step decoding, its last (new) columns (docs/internals.md#the-materialized-kernel)."""
    if incremental_state is None or key_padding_mask is None or static_kv:
        return key_padding_mask
    new_keys = query.size(0) if key is None or self_attention else key.size(0)
    return key_padding_mask[:, -new_keys:]


class KernelNotes:
    """What the attention modules of one model share about their kernels: the lines said (each once
    per model) and, once Triton failed under ``auto``, why."""

    def __init__(self):
        self.said = set()
        self.summarized = set()  # (device type, dtype, kernel asked, Triton's failure) said in one line
        self.triton_failed: Optional[str] = None

    def say(self, level: int, message: str, *args, log: Optional[logging.Logger] = None) -> None:
        """``(log or this module's logger).log(level, message, *args)``, the first time only."""
        if torch.compiler.is_compiling() or (message, args) in self.said:  # a traced graph must not break here
            return
        self.said.add((message, args))
        (log or logger).log(level, message, *args)


def share_kernel_notes(model) -> KernelNotes:
    """Give every :class:`ResidualMultiheadAttention` of ``model`` one :class:`KernelNotes`."""
    notes = KernelNotes()
    for module in model.modules():
        if isinstance(module, ResidualMultiheadAttention):
            module.notes = notes
    return notes


class ResidualMultiheadAttention(MaterializedKernel, BiasKernel, TritonKernel, MultiheadAttention):
    """fairseq ``MultiheadAttention`` that threads RealFormer's residual scores (fairseq's parameters).

    ``residual``: on a residual path (off: exactly fairseq's module); ``mode``: ``"sum"`` or
    ``"mean"``; ``kernel``: ``"auto"``, ``"materialized"``, ``"bias"`` or ``"triton"`` (docs/internals.md#kernels);
    ``value_residual``: None (off), ``"half"`` or ``"learned"`` (value_residual.py), ``value_first``: the path's
    first layer."""

    def __init__(self, *args, residual: bool = False, mode: str = "sum", kernel: str = "auto",
                 value_residual: Optional[str] = None, value_first: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        if mode not in RESIDUAL_MODES:
            raise ValueError(f"residual attention mode must be one of {RESIDUAL_MODES}, got {mode!r}")
        if kernel not in KERNELS:
            raise ValueError(f"residual attention kernel must be one of {KERNELS}, got {kernel!r}")
        if residual and (self.bias_k is not None or self.add_zero_attn or self.use_xformers):
            raise ValueError("residual attention does not support add_bias_kv, add_zero_attn or xformers")
        self.residual = residual
        self.mode = mode
        self.kernel = kernel
        # analysis only: a call that returns weights also leaves this layer's own in own_weights
        self.need_own_weights = False
        self.own_weights: Optional[Tensor] = None
        self.notes = KernelNotes()
        self.value_residual = ValueResidual(self.v_proj, value_residual, value_first) if value_residual else None
        use_fairseq_dropout_names(self, "MultiheadAttention")

    def extra_repr(self) -> str:
        if not self.residual:
            return "residual=False"
        return f"residual=True, mode={self.mode}, kernel={self.kernel}"

    def forward(self, query: Tensor, key: Optional[Tensor], value: Optional[Tensor],
                key_padding_mask: Optional[Tensor] = None, incremental_state: Optional[IncrementalState] = None,
                need_weights: bool = True, static_kv: bool = False, attn_mask: Optional[Tensor] = None,
                need_head_weights: bool = False, residual_path: Optional[ResidualPath] = None,
                mask_facts: Optional[MaskFacts] = None) -> Tuple[Tensor, Optional[Tensor]]:
        """Input ``T x B x C``; returns fairseq's ``(output [T, B, C], weights)``.

        ``key_padding_mask``: ``[B, S]``, True at padded keys, covering *all* keys, cached ones
        included. ``residual_path``: the caller's :class:`ResidualPath` (the previous layer's state
        in, this layer's out; None: computed as a first layer). ``mask_facts``: the masks'
        :class:`MaskFacts` (None: established here when a kernel needs them)."""
        if self.value_residual is not None and self.value_residual.call is None:  # V_1 in, V mixed, V_1 out
            return self.value_residual.around(self.residual, residual_path, lambda path: self.forward(
                query, key, value, key_padding_mask, incremental_state, need_weights, static_kv, attn_mask,
                need_head_weights, path, mask_facts))
        prev_state = residual_path.state if residual_path is not None else None
        if not self.residual and self.value_residual is None:
            if prev_state is not None:
                raise ValueError("prev_state given to an attention module that is not on a residual path")
            padding = new_keys_padding(key_padding_mask, query, key, incremental_state, static_kv, self.self_attention)
            return super().forward(query, key, value, key_padding_mask=padding, incremental_state=incremental_state,
                                   need_weights=need_weights, static_kv=static_kv, attn_mask=attn_mask,
                                   need_head_weights=need_head_weights)
        need_weights = need_weights or need_head_weights
        kernel = self.kernel_for(query, key, incremental_state, need_weights, prev_state)
        if kernel in ("bias", "triton"):
            facts = mask_facts if mask_facts is not None else MaskFacts.of(key_padding_mask, attn_mask)
            run = self._bias_forward if kernel == "bias" else self._triton_forward
            try:
                output, weights, state = run(query, key, value, key_padding_mask, attn_mask, prev_state, facts)
            except TritonFailed as failure:  # under auto, Triton failed to compile or launch (forward or backward)
                # auto stops choosing it in this model
                self.notes.triton_failed = f"Triton failed on this machine: {failure_line(failure.__cause__)}"
                self.notes.say(logging.WARNING, "residual attention kernel 'triton' disabled for auto in this model "
                               "(%s): auto runs its other kernels from here on", self.notes.triton_failed)
                return self.forward(query, key, value, key_padding_mask, incremental_state, need_weights,
                                    static_kv, attn_mask, need_head_weights, residual_path, mask_facts)
        else:
            output, weights, state = self._materialized_forward(query, key, value, key_padding_mask, incremental_state,
                                                                need_weights, static_kv, attn_mask, need_head_weights,
                                                                prev_state)
        if residual_path is not None:
            residual_path.state = state
        return output, weights

    def kernel_for(self, query: Tensor, key: Optional[Tensor], incremental_state, need_weights: bool,
                   prev_state: Optional[ResidualState]) -> str:
        """The kernel this call runs (``materialized``, ``bias`` or ``triton``); what the model runs is
        said in one line per model (again only if it changes: another device or dtype, Triton failing)."""
        terms = (prev_state.terms if prev_state is not None else 0) + 1
        kernel = "materialized" if incremental_state is not None or need_weights else self._choose_kernel(query, terms)
        seen = (query.device.type, query.dtype, self.kernel, self.notes.triton_failed)
        if seen not in self.notes.summarized and not torch.compiler.is_compiling():
            self.notes.summarized.add(seen)
            first, later = self._choose_kernel(query, 1), self._choose_kernel(query, 2)
            runs = first if first == later else f"{first} for a path's first layer, {later} for later layers"
            self.notes.say(logging.INFO, "residual attention: --residual-attention-kernel %s runs %s on %s %s "
                           "(cached decoding and asked-for attention weights: materialized)", self.kernel, runs,
                           query.device.type, str(query.dtype).replace("torch.", ""))
        return kernel

    def _choose_kernel(self, query, terms: int) -> str:
        """The kernel of a full (uncached) pass for layer ``terms`` of a path."""
        kernel = self.kernel
        where = dict(device=query.device, training_dropout=self._dropout_p() > 0, terms=terms)
        failed = self.notes.triton_failed if kernel == "auto" else None  # explicit triton: its errors go through
        if kernel == "auto":
            kernel = choice.auto_kernel(**where, dtype=query.dtype, head_dim=self.head_dim,
                                        prefer_triton=False if failed else None, notes=self.notes)
        if kernel == "triton":
            reason = failed or unsupported(query.device, query.dtype, self.head_dim)
            if reason is not None:
                kernel = choice.auto_kernel(**where, prefer_triton=False, notes=self.notes)
                note_fallback(self.notes, reason, kernel)
        return kernel

    def _dropout_p(self) -> float:
        dropout = self.dropout_module
        return dropout.p if (self.training or dropout.apply_during_inference) else 0.0

    def _divisor(self, terms: int) -> float:
        return divisor(self.mode, terms)

    # shared by the kernels

    def _project(self, query: Tensor, key: Optional[Tensor], value: Optional[Tensor], scaled: bool = True):
        """fairseq's q/k/v projections as ``[B, H, T, d]`` tensors (``q`` scaled unless ``scaled`` is False)."""
        q = self.q_proj(query) * self.scaling if scaled else self.q_proj(query)
        if self.self_attention:
            key = value = query
        elif self.encoder_decoder_attention:
            value = key
        k, v = self.k_proj(key), self.v_proj(value)
        return self._heads(q), self._heads(k), self._heads(v)

    def _heads(self, x: Tensor) -> Tensor:
        length, bsz, _ = x.size()
        return x.view(length, bsz, self.num_heads, self.head_dim).permute(1, 2, 0, 3)

    def _project_out(self, attn: Tensor, tgt_len: int, bsz: int) -> Tensor:
        """``[B, H, T, D]`` -> ``[T, B, H * D]`` -> ``out_proj``."""
        attn = attn.reshape(bsz, self.num_heads, tgt_len, self.head_dim).permute(2, 0, 1, 3)
        return self.out_proj(attn.reshape(tgt_len, bsz, self.embed_dim))

