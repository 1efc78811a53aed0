"""RealFormer (residual attention) for fairseq.

Importing this package, or passing ``--user-dir realformer_nmt`` to a fairseq CLI,
registers the RealFormer models and architectures (``models/``), the ``masked_lm_nsp``
task (``tasks/``) and its criterions (``criterions/``), and changes nothing else in the
process, whatever the environment. It imports nothing of the tools (``realformer_tools``,
beside it), whose launcher ``realformer-fairseq <fairseq-command> ...`` runs a fairseq
command with the fixes to fairseq 0.12 (checkpoints that load on torch >= 2.6, ...;
docs/reliability.md).
"""

from . import criterions, models, tasks  # noqa: F401  (register the models, the task and the criterions)

__version__ = "0.1.0"
