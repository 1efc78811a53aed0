"""Criterions fairseq lacks: masked LM with accuracy, masked LM + next-sentence prediction."""

from . import masked_lm_acc, masked_lm_nsp  # noqa: F401  (registers them)
