"""The ``triton`` kernel's side of :class:`ResidualMultiheadAttention`: where it applies, the fallback
where it does not, and the call (``triton.py`` is imported only when it runs)."""

import importlib.util
import logging
import os
import sys
from functools import lru_cache
from typing import Optional

import torch

from .state import ResidualState

logger = logging.getLogger(__name__)

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
MAX_HEAD_DIM = 256


def interpreted() -> bool:
    """Whether Triton kernels run in Triton's interpreter (``TRITON_INTERPRET`` when triton is imported)."""
    language = sys.modules.get("triton.language")
    if language is None:  # not imported yet: as it will be
        return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "on", "yes")
    return type(language.zeros).__name__ == "InterpretedFunction"


@lru_cache(maxsize=None)
def _installed() -> bool:
    return importlib.util.find_spec("triton") is not None


@lru_cache(maxsize=None)
def _capability(index: int):
    return torch.cuda.get_device_capability(index)


def capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (False with a CPU build of torch)."""
    try:
        return torch.cuda.is_current_stream_capturing()
    except RuntimeError:  # a CPU build: no CUDA graphs
        return False


def unsupported(device: torch.device, dtype: Optional[torch.dtype] = None,
                head_dim: Optional[int] = None) -> Optional[str]:
    """Why the ``triton`` kernel cannot run a call (None: it can); ``dtype``/``head_dim`` None: not checked."""
    if not _installed():
        return "triton is not installed: pip install 'realformer-nmt[triton]'"
    if device.type == "cpu":
        if not interpreted():
            return "on CPU it runs only in Triton's interpreter: TRITON_INTERPRET=1 set before triton is imported"
    elif device.type == "cuda":
        if dtype == torch.float64 and not interpreted():
            return "float64 on CUDA, which it is not built or checked for"
        if not torch.cuda.is_available():
            return "no CUDA device"
        index = device.index if device.index is not None else torch.cuda.current_device()
        if not interpreted() and _capability(index) < (8, 0):
            return "a GPU of compute capability 8.0 or newer is needed"
        if capturing():
            return ("a CUDA graph is being captured (the dropout's Philox seed and offset, read from torch's "
                    "generator, and the first call's compile check cannot run during capture)")
    else:
        return f"no Triton kernel for {device.type} tensors"
    if dtype is not None and dtype not in DTYPES:
        return f"{dtype} inputs"
    if head_dim is not None and head_dim > MAX_HEAD_DIM:
        return f"head dim {head_dim} > {MAX_HEAD_DIM}"
    return None


def note_fallback(notes, reason: str, kernel: str) -> None:
    """Say once per model (``notes``) that ``triton`` does not apply for ``reason``: calls run ``kernel``."""
    if notes is not None:
        notes.say(logging.WARNING, "residual attention kernel 'triton' does not apply here (%s): such calls run "
                  "'%s' (said once per model)", reason, kernel, log=logger)


class TritonFailed(Exception):
    """Triton failed to compile or launch a kernel under ``auto`` (the error is ``__cause__``)."""


def failure_line(error: BaseException) -> str:
    """``"Type: first line of the message"``, at most 300 characters: how a failure is said in one line."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:300]


class TritonKernel:
    """The ``triton`` kernel, a part of :class:`ResidualMultiheadAttention`; it hands on the float32
    ``A_n``, as ``materialized`` does, so any kernel can follow it on a path."""

    def _triton_forward(self, query, key, value, key_padding_mask, attn_mask, prev_state, facts):
        tgt_len, bsz, _ = query.size()
        src_len = tgt_len if key is None or self.self_attention else key.size(0)
        causal = attn_mask is not None
        if causal and not (facts.future and tuple(attn_mask.shape) == (tgt_len, src_len)):
            note_fallback(self.notes, "an attention mask other than fairseq's causal mask", "materialized")
            return self._materialized_forward(query, key, value, key_padding_mask, None, False, False,
                                              attn_mask, False, prev_state)
        q, k, v = self._project(query, key, value, scaled=False)  # [B, H, T|S, d]; the kernel scales
        prev, terms = None, 1
        if prev_state is not None:
            prev = prev_state.running_sum()
            expected = (bsz, self.num_heads, tgt_len, k.size(2))
            if tuple(prev.shape) != expected:
                raise ValueError(f"the previous layer's scores have shape {tuple(prev.shape)}, expected {expected} "
                                 "(batch x heads x tgt_len x src_len of this layer)")
            terms += prev_state.terms
        # the causal kernel skips what lies above the diagonal unless a row sees only padded keys
        skip_future = causal and (key_padding_mask is None or facts.dead_rows is None)
        run = dict(causal=causal, skip_future=skip_future, divisor=self._divisor(terms), scale=self.scaling,
                   dropout_p=self._dropout_p())
        try:  # under auto, whatever Triton raises here (compiling, launching; forward or backward) is a fallback
            from . import triton as kernels

            if self.kernel == "auto":  # the backward kernels too, before the first real call of these flags
                kernels.probe(q, k, v, prev, key_padding_mask, **run)
            out, scores, rebuild = kernels.residual_attention(
                q, k, v, prev, key_padding_mask, chain=None if prev_state is None else prev_state.rebuild, **run)
        except Exception as error:
            # out of memory is the batch's, not Triton's: fairseq skips the batch (or stops) as for any kernel,
            # and auto keeps triton
            if self.kernel != "auto" or isinstance(error, torch.OutOfMemoryError):
                raise
            raise TritonFailed(error) from error
        return self._project_out(out, tgt_len, bsz), None, ResidualState(scores=scores, terms=terms, rebuild=rebuild)
