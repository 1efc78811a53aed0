"""RealFormer (residual attention) for fairseq.

Importing this package, or passing ``--user-dir realformer_nmt`` to a fairseq CLI,
registers the ``realformer_transformer`` model and its architectures and makes
fairseq checkpoints load under torch's ``weights_only`` unpickler.
"""

from .errors import install_excepthook

install_excepthook()

from . import checkpoint_safety  # noqa: E402  (allow-lists fairseq's checkpoint types)
from . import atomic_checkpoints  # noqa: E402  (atomic checkpoint_last/best copies)
from . import data_checks  # noqa: E402  (one-line errors for unusable data dirs)
from . import fairseq_fixes  # noqa: E402  (no silently dropped sentences or input lines)
from . import models  # noqa: E402,F401  (registers the model and architectures)

__version__ = "0.1.0"
