"""fairseq names each dropout module after the class that owns it, and
``--retain-dropout-modules`` selects them by that name (e.g. ``[MultiheadAttention]``).
Our subclasses keep fairseq's names, so recipes written for ``transformer`` and
``roberta`` keep dropout in the same modules."""

from fairseq.modules import FairseqDropout


def use_fairseq_dropout_names(module, name: str):
    """Give ``module``'s own dropout modules (direct children) the name fairseq uses."""
    for child in module.children():
        if isinstance(child, FairseqDropout):
            child.module_name = name
