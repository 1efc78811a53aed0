"""RealFormer (residual attention) for fairseq.

Importing this package, or passing ``--user-dir realformer_nmt`` to a fairseq CLI,
registers the RealFormer models and architectures (``models/``), the ``masked_lm_nsp``
task (``tasks/``) and its criterions (``criterions/``), and changes nothing else in the
process. The fixes to fairseq 0.12 itself (``realformer_tools.fairseq_fixes``: safe checkpoint
loading, atomic checkpoint copies, one-line errors, ...) are opt-in: ``REALFORMER_NMT_FAIRSEQ_FIXES=1``
(and ``REALFORMER_NMT_DATA_FIXES=1`` for the two that change what fairseq trains on), or
:func:`install_fairseq_fixes`; see ``fairseq_fixes_switch`` and docs/reliability.md.

This package is the plugin: ``modules/`` (the residual attention rule and the layers),
``models/`` (the registered models), ``tasks/`` and ``criterions/``. The tools (commands,
corpora, comparisons, conversion, export, the fairseq fixes) are the ``realformer_tools``
package beside it, which the plugin imports only when a switch asks for the fixes.
"""

from . import criterions, models, tasks  # noqa: F401  (register the models, the task and the criterions)
from .fairseq_fixes_switch import install_asked, install_fairseq_fixes  # noqa: F401

install_asked()  # nothing unless REALFORMER_NMT_FAIRSEQ_FIXES / REALFORMER_NMT_DATA_FIXES ask for fixes

__version__ = "0.1.0"
