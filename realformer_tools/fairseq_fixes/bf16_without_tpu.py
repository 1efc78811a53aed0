"""``--bf16`` trains in bfloat16 wherever fairseq's bf16 path runs (a CUDA GPU, the CPU),
not only on a TPU; ``--fp16`` training on CPU is refused at once with one sentence.

Bugs (fairseq 0.12.2; the first is still in ``options.py`` on fairseq's main branch):

1. ``options.parse_args_and_arch`` turns ``--bf16`` (and ``--memory-efficient-bf16``)
   into ``--tpu``, so ``fairseq-train --bf16`` on a CUDA machine without torch_xla, and
   ``fairseq-train --cpu --bf16``, ask torch_xla for a device and die with ``'NoneType'
   object has no attribute 'xla_device'``. Yet the trainer's bf16 path is device-neutral:
   the model is cast to bfloat16, ``FP16Optimizer`` keeps fp32 master weights (one per
   parameter: fairseq never flattens them for bf16), ``MemoryEfficientFP16Optimizer`` keeps
   fp32 Adam moments, and no loss scaler is used.
2. ``--fp16`` training needs CUDA in two places: ``FP16Optimizer`` keys its flat fp32
   master buffer by ``torch.cuda.current_device()`` ("Torch not compiled with CUDA
   enabled" on CPU), and ``Trainer.train_step`` answers a gradient overflow with
   ``torch.tensor(0.0).cuda()``, inline: a CPU fp16 run dies at the loss scaler's first
   overflow, after ``--save-dir`` was created and training started.

Fixes, each at one seam, no fairseq function copied:

1. ``options.parse_args_and_arch`` is wrapped: after fairseq's own post-processing,
   ``--bf16`` keeps implying ``--tpu`` only where a TPU can be used (torch_xla importable
   and no ``--cpu``); ``--tpu`` given explicitly is left alone; one log line says so. Where
   it acts fairseq alone stops at once (torch_xla missing), so no working command changes:
   this fix is one of the launcher's defaults.
2. ``--fp16``/``--memory-efficient-fp16`` training on CPU raise a
   :class:`~realformer_nmt.errors.ConfigError` saying to use ``--bf16``: right after
   fairseq-train parses its command line (before ``--save-dir`` is created), and again in the
   wrapped ``Trainer.__init__`` (a Trainer built by other code). Decoding with ``--fp16
   --cpu`` works and is left alone.

(Decoding in bfloat16, which fairseq 0.12 never does, is another fix, opt-in because it
changes numbers: ``bf16_decoding``.)

When it is no longer needed (how to tell): with the wrappers removed (``uninstall()``),
``options.parse_args_and_arch`` leaves ``tpu`` off for ``--bf16`` without torch_xla, and
``fairseq-train --cpu --fp16`` survives an overflowing loss scale
(``--fp16-init-scale 1048576``).
``tests/test_mixed_precision_cpu.py::test_fairseq_alone_cannot_train_mixed_precision_on_cpu``
checks what fairseq does alone and fails once fairseq is fixed.
"""

import functools
import logging
import sys

import torch
from fairseq import options
from fairseq import utils as fairseq_utils
from fairseq.trainer import Trainer

from realformer_nmt.errors import ConfigError

from .seams import FIXED as _FIXED
from .seams import install_seams, uninstall_seams

logger = logging.getLogger(__name__)

# on a log record: a note on the command line, logged while fairseq parses it; the launcher holds it
# until the command logs its own first line (an input refused before that stays the only line printed)
COMMAND_LINE_NOTE = "realformer_command_line_note"

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
                    "decodes in bfloat16 (the model cast when it is loaded)" if _casts_for_inference() else
                    "decodes in float32 as fairseq does (the launcher's --bf16-decoding casts the model)")
            logger.info("--bf16 without a TPU (%s): %s on this device; fairseq 0.12 alone would turn --bf16 into "
                        "--tpu (realformer_tools.fairseq_fixes.bf16_without_tpu)",
                        "--cpu" if getattr(parsed, "cpu", False) else "no TPU library installed", what,
                        extra={COMMAND_LINE_NOTE: True})
        if input_args is None:  # a command line being run (sys.argv), not a parse by library code
            refuse_fp16_training_on_cpu(parsed)
        return result

    setattr(wrapper, _FIXED, True)
    return wrapper


def _casts_for_inference() -> bool:
    """Whether the opt-in ``bf16_decoding`` fix is installed (fairseq-generate's ``main`` wrapped)."""
    from fairseq_cli import generate

    return getattr(generate.main, "__realformer_bf16_decoding__", False)


def _trains(parsed) -> bool:
    """A training command line (fairseq-train's parser has --max-update and --save-dir)."""
    return all(hasattr(parsed, name) for name in ("max_update", "save_dir"))


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
    (Trainer, "__init__", no_fp16_on_cpu),
)

# what install() replaces (module:attribute, as fairseq looks it up) and what that changes, for the
# launcher's log line and its restoring (realformer_tools.fairseq_fixes.fixes_installed)
REPLACES = (
    "fairseq.options:parse_args_and_arch",
    "fairseq.trainer:Trainer.__init__",
)
CHANGES = ("--bf16 without a TPU trains in bfloat16 (GPU or CPU) instead of asking for torch_xla; "
           "--fp16 training on CPU refused in one line before --save-dir exists")


def install():
    install_seams(_SEAMS)


def uninstall():
    """Restore fairseq's own functions (tests use this to see what fairseq does alone)."""
    uninstall_seams(_SEAMS)
