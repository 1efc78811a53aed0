"""Tasks fairseq lacks: masked LM + next-sentence prediction (``masked_lm_nsp``)."""

from . import masked_lm_nsp  # noqa: F401  (registers it)
