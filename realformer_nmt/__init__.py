"""RealFormer (residual attention) for fairseq.

Importing this package, or passing ``--user-dir realformer_nmt`` to a fairseq CLI,
registers the RealFormer models and architectures and installs the fixes to fairseq
0.12 itself (``realformer_tools.fairseq_fixes``: safe checkpoint loading, atomic checkpoint
copies, no dropped batches, ...).

This package is the plugin: ``modules/`` (the residual attention rule and the layers),
``models/`` (the registered models), ``tasks/`` and ``criterions/``. The tools (commands,
corpora, comparisons, conversion, export) are the ``realformer_tools`` package beside it.
"""

from ._import_logging import root_logging_unchanged
from .errors import install_excepthook

install_excepthook()

with root_logging_unchanged():  # fairseq's imports configure the root logger (see _import_logging)
    from realformer_tools import fairseq_fixes as fairseq_patches  # noqa: E402
    from . import residual_config  # noqa: E402

    fairseq_patches.install_all()
    if residual_config.tag_checkpoint not in fairseq_patches.safe_checkpoint_loading.AFTER_LOAD_HOOKS:
        fairseq_patches.safe_checkpoint_loading.AFTER_LOAD_HOOKS.append(residual_config.tag_checkpoint)

    from . import models  # noqa: E402,F401  (registers the models and architectures)
    from . import criterions, tasks  # noqa: E402,F401  (registers the pre-training objectives)

__version__ = "0.1.0"
