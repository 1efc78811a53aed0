"""RealFormer (residual attention) for fairseq.

Importing this package, or passing ``--user-dir realformer_nmt`` to a fairseq CLI,
registers the RealFormer models and architectures and installs the fixes to fairseq
0.12 itself (``fairseq_patches``: safe checkpoint loading, atomic checkpoint copies,
no dropped batches, ...).

Layout: ``modules/`` (the residual attention rule and the layers), ``models/`` (the
registered models), ``fairseq_patches/``, ``data/`` (corpus preparation) and
``experiments/`` (benchmarks and comparisons, fronted by ``scripts/``).
"""

from ._import_logging import root_logging_unchanged
from .errors import install_excepthook

install_excepthook()

with root_logging_unchanged():  # fairseq's imports configure the root logger (see _import_logging)
    from . import fairseq_patches  # noqa: E402
    from . import residual_config  # noqa: E402

    fairseq_patches.install_all()
    if residual_config.tag_checkpoint not in fairseq_patches.safe_checkpoint_loading.AFTER_LOAD_HOOKS:
        fairseq_patches.safe_checkpoint_loading.AFTER_LOAD_HOOKS.append(residual_config.tag_checkpoint)

    from . import models  # noqa: E402,F401  (registers the models and architectures)
    from . import criterions, tasks  # noqa: E402,F401  (registers the pre-training objectives)

__version__ = "0.1.0"
