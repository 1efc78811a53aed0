"""fairseq drops the last batch when its size is not a multiple of
``--required-batch-size-multiple``; keep it.

Bug (fairseq 0.12, issue #5036): ``fairseq.data.data_utils.batch_by_size`` silently
leaves out the final ``len(indices) % required_batch_size_multiple`` sentences (up to 7
with the default 8). ``fairseq-generate`` then leaves test sentences untranslated
without a word and sacreBLEU is scored on the rest; training loses the same sentences
every epoch.

Fix: the remainder is appended as a final, smaller batch. It changes what is trained and
scored, so it is installed only with ``REALFORMER_NMT_DATA_FIXES=1`` (``realformer_tools.fairseq_fixes``).

When it is no longer needed: ``fairseq-generate --batch-size 8`` on a test set of 13
sentences prints 13 hypotheses with the patch uninstalled
(``tests/test_reliability_data.py`` checks what vanilla fairseq does).
"""

import functools

import numpy as np
from fairseq.data import data_utils


def keep_last_partial_batch(batch_by_size):
    @functools.wraps(batch_by_size)
    def wrapper(indices, *args, **kwargs):
        batches = list(batch_by_size(indices, *args, **kwargs))
        kept = sum(len(b) for b in batches)
        if kept < len(indices):
            batches.append(np.asarray(indices[kept:], dtype=np.int64))
        return batches

    wrapper.__realformer_fixed__ = True
    return wrapper


# what install() replaces (module:attribute, as fairseq looks it up) and what that changes, for the
# launcher's log line and its restoring (realformer_tools.fairseq_fixes.fixes_installed)
REPLACES = (
    "fairseq.data.data_utils:batch_by_size",
)
CHANGES = ("every sentence batched: the last len % --required-batch-size-multiple sentences (up to 7) form "
           "a smaller batch instead of being dropped")


def install():
    if not getattr(data_utils.batch_by_size, "__realformer_fixed__", False):
        data_utils.batch_by_size = keep_last_partial_batch(data_utils.batch_by_size)
