"""fairseq 0.12 calls numpy 1 APIs that numpy 2 removed; route them to their numpy 2 names.

Bugs (fairseq 0.12 with numpy >= 2):

1. ``TokenBlockDataset`` with ``break_mode="eos"`` (``--sample-break-mode eos`` of
   ``masked_lm`` / ``language_modeling``) and ``LanguagePairDataset`` with
   ``--num-batch-buckets`` call ``np.compat.long``: ``AttributeError: module 'numpy' has
   no attribute 'compat'``.
2. ``data_utils.get_buckets`` (``--num-batch-buckets``, via ``BucketPadLengthDataset``)
   calls ``np.percentile(..., interpolation="lower")``: ``TypeError: percentile() got an
   unexpected keyword argument 'interpolation'`` (numpy 2 calls it ``method``).

Fixes: ``numpy.compat.long`` is defined as ``numpy.int64`` when numpy lacks it (what it
was on 64-bit Linux; nothing numpy defines is replaced), and ``get_buckets`` is the same
computation with ``method="lower"``, installed where ``BucketPadLengthDataset`` looks it up.

When it is no longer needed: fairseq's ``data/`` no longer mentions ``np.compat`` or
``interpolation=`` (or numpy < 2 is installed); ``tests/test_fairseq_patches.py`` builds
both datasets.
"""

import types

import numpy as np
from fairseq.data import bucket_pad_length_dataset, data_utils


def get_buckets(sizes, num_buckets):
    """fairseq's ``data_utils.get_buckets`` with numpy 2's ``method`` keyword."""
    return np.unique(np.percentile(sizes, np.linspace(0, 100, num_buckets + 1), method="lower")[1:])


# what install() replaces (module:attribute, as fairseq looks it up) and what that changes, for the
# launcher's log line and its restoring (realformer_tools.fairseq_fixes.fixes_installed)
REPLACES = (
    "numpy:compat",
    "fairseq.data.data_utils:get_buckets",
    "fairseq.data.bucket_pad_length_dataset:get_buckets",
)
CHANGES = ("numpy 2: numpy.compat.long defined as numpy.int64, --num-batch-buckets' percentile with method=")


def install():
    compat = getattr(np, "compat", None)
    if compat is None:
        compat = types.ModuleType("numpy.compat")
        compat.__doc__ = "realformer_nmt: the numpy 1 alias fairseq 0.12 uses (numpy 2 removed numpy.compat)"
        np.compat = compat
    if not hasattr(compat, "long"):
        compat.long = np.int64
    try:
        np.percentile([1, 2], 50, interpolation="lower")
    except TypeError:
        data_utils.get_buckets = get_buckets
        bucket_pad_length_dataset.get_buckets = get_buckets
