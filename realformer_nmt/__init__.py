"""RealFormer (residual attention) for fairseq.

Importing this package (``--user-dir realformer_nmt``) registers the RealFormer models, the
``masked_lm_nsp`` task and its criterions, and changes nothing else in the process; it never
imports the tools (``realformer_tools``), whose launcher ``realformer-fairseq`` runs fairseq
commands with the fixes to fairseq 0.12 (docs/reliability.md).
"""

from . import criterions, models, tasks  # noqa: F401  (register the models, the task and the criterions)

__version__ = "0.1.0"
