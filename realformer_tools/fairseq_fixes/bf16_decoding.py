"""bf16 mixed precision without a TPU: ``fairseq-train --cpu --bf16`` (and
``--memory-efficient-bf16``) trains through fairseq's own ``FP16Optimizer`` /
``MemoryEfficientFP16Optimizer``; ``--fp16`` on CPU is refused with one sentence.

Bugs (fairseq 0.12.2; the first is still in ``options.py`` on fairseq's main branch):

1. ``options.parse_args_and_arch`` turns ``--bf16`` (and ``--memory-efficient-bf16``)
   into ``--tpu``, so ``fairseq-train --cpu --bf16`` asks torch_xla for a device and
   dies with ``'NoneType' object has no attribute 'xla_device'``. Yet the trainer's bf16
   path is device-neutral: the model is cast to bfloat16, ``FP16Optimizer`` keeps fp32
   master weights (one per parameter: fairseq never flattens them for bf16),
   ``MemoryEfficientFP16Optimizer`` keeps fp32 Adam moments, and no loss scaler is used.
2. ``fairseq-generate``/``fairseq-interactive``/the hub interface ignore ``--bf16``
   (they cast to half for ``--fp16`` only): a bf16 model is decoded in float32.
3. ``--fp16`` training needs CUDA in two places: ``FP16Optimizer`` keys its flat fp32
   master buffer by ``torch.cuda.current_device()`` ("Torch not compiled with CUDA
   enabled" on CPU), and ``Trainer.train_step`` answers a gradient overflow with
   ``torch.tensor(0.0).cuda()``, inline. The first could be avoided (per-parameter
   masters, ``--fp16-no-flatten-grads``, do train on CPU), the second not without
   copying ``train_step``: a CPU fp16 run would die at the loss scaler's first overflow.

Fixes, each at one seam, no fairseq function copied, each logging one line when it acts
(with the fixes installed, nothing changes for a command that does not ask for bf16; one
that does, ``fairseq-generate --bf16``, then decodes in bfloat16, a vanilla model included:
other numbers than fairseq alone gives, which is why this fix is a group of its own, which
the launcher installs only when asked: ``realformer-fairseq --cpu-bf16 ...`` or
``REALFORMER_NMT_CPU_BF16=1``):

1. ``options.parse_args_and_arch`` is wrapped: after fairseq's own post-processing,
   ``--bf16`` keeps implying ``--tpu`` only where a TPU can be used (torch_xla importable
   and no ``--cpu``). ``--tpu`` given explicitly is left alone. Where it acts, fairseq
   alone would stop at once (torch_xla missing), so no working command changes: on CPU,
   and on a CUDA machine without torch_xla, ``--bf16`` then trains through the same
   device-neutral path (GPU: ``python -m realformer_tools.experiments.gpu_check``).
2. The inference commands ``fairseq-generate``, ``fairseq-interactive`` and
   ``fairseq-eval-lm`` (their ``main``) are wrapped to note whether *their command line*
   has ``--bf16`` (and not ``--fp16``); ``BaseFairseqModel.prepare_for_inference_``
   (which they call on every model) casts the model to bfloat16 only then, as fairseq
   casts it to half for ``--fp16``. A checkpoint's stored training config never casts:
   the hub interface (``from_pretrained``, which calls ``prepare_for_inference_`` with
   the checkpoint's config) gives a float32 model even for a model trained with ``--bf16``.
3. ``--fp16``/``--memory-efficient-fp16`` training on CPU raise a
   :class:`~realformer_nmt.errors.ConfigError` saying to use ``--bf16``: right after
   fairseq-train parses its command line (before ``--save-dir`` is created), and again in the
   wrapped ``Trainer.__init__`` (a Trainer built by other code). (Decoding with
   ``--fp16 --cpu`` works and is left alone.)

When it is no longer needed (how to tell): with the wrappers removed (``uninstall()``),
``options.parse_args_and_arch`` leaves ``tpu`` off for ``--cpu --bf16``,
``fairseq-generate --bf16`` decodes with bfloat16 parameters, and ``fairseq-train --cpu --fp16``
survives an overflowing loss scale (``--fp16-init-scale 1048576``).
``tests/test_mixed_precision_cpu.py::test_fairseq_alone_cannot_train_mixed_precision_on_cpu``
checks what fairseq does alone and fails once fairseq is fixed.
"""

import contextvars
import functools
import logging
import sys

import torch
from fairseq import options
from fairseq import utils as fairseq_utils
from fairseq.models.fairseq_model import BaseFairseqModel
from fairseq.trainer import Trainer
from fairseq_cli import eval_lm, generate, interactive

from realformer_nmt.errors import ConfigError

logger = logging.getLogger(__name__)

_FIXED = "__realformer_fixed__"
# True while an inference command whose command line has --bf16 (not --fp16) runs
_BF16_INFERENCE = contextvars.ContextVar("realformer_bf16_inference", default=False)

FP16_ON_CPU = (
    "--fp16 trains on CUDA GPUs only (fairseq 0.12's loss scaler calls CUDA when a gradient "
    "overflows); on CPU use --bf16 or --memory-efficient-bf16"
)


def tpu_possible() -> bool:
    """torch_xla is importable (fairseq imports it as ``utils.xm`` when it is)."""
    return getattr(fairseq_utils, "xm", None) is not None


def bf16_without_tpu(parse_args_and_arch):
    @functools.wraps(parse_args_and_arch)
    def wrapper(parser, input_args=None, *args, **kwargs):
        result = parse_args_and_arch(parser, input_args, *args, **kwargs)
        parsed = result[0] if isinstance(result, tuple) else result
        words = sys.argv[1:] if input_args is None else [str(w) for w in input_args]
        if (
            getattr(parsed, "bf16", False)
            and getattr(parsed, "tpu", False)
            and (getattr(parsed, "cpu", False) or not tpu_possible())
            and "--tpu" not in words
        ):
            parsed.tpu = False  # fairseq set it only because of --bf16
            what = ("trains in bfloat16 through fairseq's FP16Optimizer" if _trains(parsed) else
                    "decodes in bfloat16 (the model cast when it is loaded)")
            logger.info("--bf16 without a TPU (%s): %s on this device; fairseq 0.12 alone would turn --bf16 into "
                        "--tpu (realformer_tools.fairseq_fixes.cpu_bf16)",
                        "--cpu" if getattr(parsed, "cpu", False) else "no TPU library installed", what)
        if input_args is None:  # a command line being run (sys.argv), not a parse by library code
            refuse_fp16_training_on_cpu(parsed)
        return result

    setattr(wrapper, _FIXED, True)
    return wrapper


def _trains(parsed) -> bool:
    """A training command line (fairseq-train's parser has --max-update and --save-dir)."""
    return all(hasattr(parsed, name) for name in ("max_update", "save_dir"))


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
    return wrapper


def bf16_for_inference(prepare_for_inference_):
    @functools.wraps(prepare_for_inference_)
    def wrapper(self, cfg):
        first = next(self.parameters(), None)
        if _BF16_INFERENCE.get() and first is not None and first.dtype != torch.bfloat16:
            logger.info("--bf16: casting %s to bfloat16 for inference (fairseq 0.12 alone decodes in float32; "
                        "realformer_tools.fairseq_fixes.cpu_bf16)", type(self).__name__)
            self.to(dtype=torch.bfloat16)
        return prepare_for_inference_(self, cfg)

    setattr(wrapper, _FIXED, True)
    return wrapper


def trains_on_cpu(common) -> bool:
    """Where fairseq's Trainer puts the model (its own rule: CUDA unless --cpu/--tpu)."""
    return not common.tpu and (common.cpu or not torch.cuda.is_available())


def refuse_fp16_training_on_cpu(parsed):
    """A training command line (it has --max-update and --save-dir) with --fp16 on CPU is
    refused right after fairseq-train parses ``sys.argv``, before it creates --save-dir
    (decoding with ``--fp16 --cpu`` works and is left alone; library code that parses a GPU
    command on a CPU machine, e.g. to check a document, is not refused). ``Trainer.__init__``
    checks again for callers that build a Trainer without this parser."""
    if not (_trains(parsed) and all(hasattr(parsed, name) for name in ("fp16", "cpu", "tpu"))):
        return
    if (parsed.fp16 or getattr(parsed, "memory_efficient_fp16", False)) and trains_on_cpu(parsed):
        raise ConfigError(FP16_ON_CPU)


def no_fp16_on_cpu(init):
    @functools.wraps(init)
    def wrapper(self, cfg, *args, **kwargs):
        if cfg.common.fp16 and trains_on_cpu(cfg.common):
            raise ConfigError(FP16_ON_CPU)
        return init(self, cfg, *args, **kwargs)

    setattr(wrapper, _FIXED, True)
    return wrapper


_SEAMS = (
    (options, "parse_args_and_arch", bf16_without_tpu),
    (generate, "main", notes_bf16_command_line),
    (interactive, "main", notes_bf16_command_line),
    (eval_lm, "main", notes_bf16_command_line),
    (BaseFairseqModel, "prepare_for_inference_", bf16_for_inference),
    (Trainer, "__init__", no_fp16_on_cpu),
)


# what install() replaces (module:attribute, as fairseq looks it up) and what that changes, for the
# launcher's log line and its restoring (realformer_tools.fairseq_fixes.fixes_installed)
REPLACES = (
    "fairseq.options:parse_args_and_arch",
    "fairseq_cli.generate:main",
    "fairseq_cli.interactive:main",
    "fairseq_cli.eval_lm:main",
    "fairseq.models.fairseq_model:BaseFairseqModel.prepare_for_inference_",
    "fairseq.trainer:Trainer.__init__",
)
CHANGES = ("--bf16 without a TPU trains in bfloat16 instead of asking for torch_xla; "
           "fairseq-generate/-interactive/-eval-lm --bf16 decode in bfloat16 (fairseq alone: float32); "
           "--fp16 training on CPU refused in one line")


def install():
    for owner, name, fix in _SEAMS:
        if not getattr(getattr(owner, name), _FIXED, False):
            setattr(owner, name, fix(getattr(owner, name)))


def uninstall():
    """Restore fairseq's own functions (tests use this to see what fairseq does alone)."""
    for owner, name, _ in _SEAMS:
        if getattr(getattr(owner, name), _FIXED, False):
            setattr(owner, name, getattr(owner, name).__wrapped__)
