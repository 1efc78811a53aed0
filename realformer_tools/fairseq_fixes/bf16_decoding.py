"""``fairseq-generate``/``-interactive``/``-eval-lm --bf16`` decode in bfloat16 (the model cast
when it is loaded), as ``--fp16`` decodes in half; opt-in (the launcher's ``--bf16-decoding``,
or ``--cpu-bf16``, its earlier name), because it changes numbers fairseq computes alone.

Bug (fairseq 0.12.2): ``fairseq-generate``, ``fairseq-interactive``, ``fairseq-eval-lm`` and
the hub interface ignore ``--bf16`` (they cast to half for ``--fp16`` only): a bf16 model is
decoded in float32. (That ``--bf16`` also means ``--tpu`` is another fix, one of the
launcher's defaults: ``bf16_without_tpu``.)

Fix, at two seams, no fairseq function copied, one log line when it acts: the inference
commands' ``main`` is wrapped to note whether *their command line* has ``--bf16`` (and not
``--fp16``); ``BaseFairseqModel.prepare_for_inference_`` (which they call on every model)
casts the model to bfloat16 only then, as fairseq casts it to half for ``--fp16``. A
checkpoint's stored training config never casts: the hub interface (``from_pretrained``,
which calls ``prepare_for_inference_`` with the checkpoint's config) gives a float32 model
even for a model trained with ``--bf16``. With the fix installed nothing changes for a
command that does not ask for ``--bf16``; one that does decodes in bfloat16, a vanilla model
included: other numbers than fairseq alone gives, which is why the launcher installs it only
when asked (``realformer-fairseq --bf16-decoding ...`` or ``REALFORMER_NMT_BF16_DECODING=1``).

When it is no longer needed (how to tell): with the wrappers removed (``uninstall()``),
``fairseq-generate --bf16`` decodes with bfloat16 parameters.
``tests/test_mixed_precision_cpu.py::test_fairseq_alone_cannot_train_mixed_precision_on_cpu``
checks what fairseq does alone and fails once fairseq is fixed.
"""

import contextvars
import functools
import logging

import torch
from fairseq.models.fairseq_model import BaseFairseqModel
from fairseq_cli import eval_lm, generate, interactive

from .seams import FIXED as _FIXED
from .seams import install_seams, uninstall_seams

logger = logging.getLogger(__name__)

# True while an inference command whose command line has --bf16 (not --fp16) runs
_BF16_INFERENCE = contextvars.ContextVar("realformer_bf16_inference", default=False)


def _asks_bf16(cfg) -> bool:
    """``--bf16`` and not ``--fp16`` in an inference command's config (Namespace or Hydra)."""
    common = getattr(cfg, "common", cfg)
    return bool(getattr(common, "bf16", False)) and not getattr(common, "fp16", False)


def notes_bf16_command_line(main):
    """Wrap an inference command's ``main(cfg)``: its models are cast to bf16 if its own
    command line asked for ``--bf16``."""
    @functools.wraps(main)
    def wrapper(cfg, *args, **kwargs):
        token = _BF16_INFERENCE.set(_asks_bf16(cfg))
        try:
            return main(cfg, *args, **kwargs)
        finally:
            _BF16_INFERENCE.reset(token)

    setattr(wrapper, _FIXED, True)
    wrapper.__realformer_bf16_decoding__ = True  # (bf16_without_tpu's line says what decoding does)
    return wrapper


def bf16_for_inference(prepare_for_inference_):
    @functools.wraps(prepare_for_inference_)
    def wrapper(self, cfg):
        first = next(self.parameters(), None)
        if _BF16_INFERENCE.get() and first is not None and first.dtype != torch.bfloat16:
            logger.info("--bf16: casting %s to bfloat16 for inference (fairseq 0.12 alone decodes in float32; "
                        "realformer_tools.fairseq_fixes.bf16_decoding)", type(self).__name__)
            self.to(dtype=torch.bfloat16)
        return prepare_for_inference_(self, cfg)

    setattr(wrapper, _FIXED, True)
    return wrapper


_SEAMS = (
    (generate, "main", notes_bf16_command_line),
    (interactive, "main", notes_bf16_command_line),
    (eval_lm, "main", notes_bf16_command_line),
    (BaseFairseqModel, "prepare_for_inference_", bf16_for_inference),
)


# what install() replaces (module:attribute, as fairseq looks it up) and what that changes, for the
# launcher's log line and its restoring (realformer_tools.fairseq_fixes.fixes_installed)
REPLACES = (
    "fairseq_cli.generate:main",
    "fairseq_cli.interactive:main",
    "fairseq_cli.eval_lm:main",
    "fairseq.models.fairseq_model:BaseFairseqModel.prepare_for_inference_",
)
CHANGES = "fairseq-generate/-interactive/-eval-lm --bf16 decode in bfloat16 (fairseq alone: float32)"


def install():
    install_seams(_SEAMS)


def uninstall():
    """Restore fairseq's own functions (tests use this to see what fairseq does alone)."""
    uninstall_seams(_SEAMS)
