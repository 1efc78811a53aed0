"""Value residual (ResFormer, Zhou et al., arXiv 2410.17897): every layer of a path after its first
mixes the first layer's values into its own, ``V'_n = λ1 V_n + λ2 V_1``, right after the value
projection, before the cache and the attention kernel (docs/internals.md#value-residual)."""

from typing import Optional

import torch
from torch import Tensor, nn

from .state import ResidualPath, ResidualState

VALUE_MIXES = ("half", "learned")
LEARNED_INIT = 0.5  # λ of the learned mix (λ1 = 1 - λ, λ2 = λ): it starts as the half mix


class ValueCall:
    """One attention call's value residual: the path's ``V_1`` in (``first``; None: this layer is
    the first of its path that runs, and its own values become ``V_1``)."""

    __slots__ = ("first", "is_first")

    def __init__(self, first: Optional[Tensor]):
        self.first = first
        self.is_first = first is None


class ValueResidual(nn.Module):
    """The value residual of one attention module: a forward hook on its ``v_proj`` mixes the
    projection's output ``[S, B, C]`` during a call run by :meth:`around`.

    ``mix``: ``"half"`` (``λ1 = λ2 = 0.5``) or ``"learned"`` (``lamb``, one scalar parameter ``λ``,
    ``λ1 = 1 - λ`` and ``λ2 = λ``, initialised to ``LEARNED_INIT``: modded-nanogpt's convex value residual
    mix; absent on a path's first layer, ``first``, which never mixes)."""

    def __init__(self, v_proj: nn.Module, mix: str, first: bool = False):
        super().__init__()
        if mix not in VALUE_MIXES:
            raise ValueError(f"value residual mix must be one of {VALUE_MIXES}, got {mix!r}")
        self.mix = mix
        self.first = first
        self.lamb = nn.Parameter(torch.tensor(LEARNED_INIT)) if mix == "learned" and not first else None
        self.call: Optional[ValueCall] = None
        v_proj.register_forward_hook(self._mix_values)

    def extra_repr(self) -> str:
        return f"mix={self.mix}" + (", first" if self.first else "")

    def around(self, on_score_path: bool, residual_path: Optional[ResidualPath], attend):
        """Run ``attend(path)`` (the attention call) with this call's ``V_1``: the previous state's
        ``first_value`` goes in, the score part alone goes to the kernels (``path``), and the state
        left in ``residual_path`` carries ``V_1`` on (this layer's own values if it was the first)."""
        prev = residual_path.state if residual_path is not None else None
        scores = prev._replace(first_value=None) if prev is not None and prev.terms > 0 else None
        if scores is not None and not on_score_path:
            raise ValueError("residual scores given to an attention module that is not on a residual path")
        inner = ResidualPath(scores)
        self.call = ValueCall(prev.first_value if prev is not None else None)
        try:
            output = attend(inner)
            first = self.call.first
        finally:
            self.call = None
        if residual_path is not None:
            state = inner.state if on_score_path and inner.state is not None else ResidualState()
            residual_path.state = state._replace(first_value=first)
        return output

    def _mix_values(self, v_proj, inputs, v: Tensor) -> Optional[Tensor]:
        call = self.call
        if call is None:  # v_proj called outside an attention call: untouched
            return None
        if call.is_first:  # the first layer of the path that runs: its values are V_1
            call.first = v
            return None
        return self.mixed(v, call.first)

    def mixed(self, v: Tensor, first: Tensor) -> Tensor:
        """``λ1 v + λ2 first``: ``0.5 v + 0.5 first`` (half) or ``(1 - λ) v + λ first`` (learned)."""
        if first.shape != v.shape:
            raise ValueError(f"the first layer's values have shape {tuple(first.shape)}, this layer's "
                             f"{tuple(v.shape)} (value residual mixes the same positions)")
        if self.mix == "half":
            return 0.5 * v + 0.5 * first
        if self.lamb is None:
            raise RuntimeError("value residual: a path's first layer has no mix, yet it was given V_1")
        lamb = self.lamb.to(v.dtype)
        return (1 - lamb) * v + lamb * first

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        """A checkpoint without ``lamb`` (no value residual, or the half mix) loads with this model's
        initial one (the half mix); a first layer's, unused here (a pruned model), is dropped."""
        key = prefix + "lamb"
        if self.lamb is not None and key not in state_dict:
            state_dict[key] = self.lamb.detach().clone()
        elif self.lamb is None:
            state_dict.pop(key, None)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
