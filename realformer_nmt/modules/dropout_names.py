"""Our subclasses keep fairseq's dropout module names, which ``--retain-dropout-modules`` selects by."""

from fairseq.modules import FairseqDropout


def use_fairseq_dropout_names(module, name: str):
    """Give ``module``'s own dropout modules (direct children) the name fairseq uses."""
    for child in module.children():
        if isinstance(child, FairseqDropout):
            child.module_name = name
