"""Two fairseq 0.12 input bugs that lose data silently; fixed on import of the plugin.

1. ``data_utils.batch_by_size`` drops the last batch when its size is not a multiple
   of ``--required-batch-size-multiple`` (default 8): ``fairseq-generate`` leaves up to
   7 test sentences untranslated, without a word, and BLEU is scored on the rest
   (fairseq issue #5036). The remainder is kept as a final, smaller batch.
2. ``fairseq-interactive`` decodes its input strictly: one invalid UTF-8 byte raises
   ``UnicodeDecodeError`` and the translations of the lines around it are lost.
   Undecodable bytes become U+FFFD (translated as ``<unk>``), with a warning per line.
"""

import fileinput
import functools
import logging
import sys

import numpy as np

import fairseq_cli.interactive
from fairseq.data import data_utils

logger = logging.getLogger(__name__)


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


def buffered_read(input, buffer_size):
    """``fairseq_cli.interactive.buffered_read``, replacing invalid UTF-8 instead of failing."""
    if input == "-":
        sys.stdin.reconfigure(errors="replace")  # fileinput reads "-" from sys.stdin as is
    buffer = []
    hook = fileinput.hook_encoded("utf-8", errors="replace")
    with fileinput.input(files=[input], openhook=hook) as h:
        for src_str in h:
            if "\ufffd" in src_str:
                logger.warning("input line %d is not valid UTF-8: undecodable bytes replaced", h.filelineno())
            buffer.append(src_str.strip())
            if len(buffer) >= buffer_size:
                yield buffer
                buffer = []
    if buffer:
        yield buffer


def install():
    if not getattr(data_utils.batch_by_size, "__realformer_fixed__", False):
        data_utils.batch_by_size = keep_last_partial_batch(data_utils.batch_by_size)
    fairseq_cli.interactive.buffered_read = buffered_read


install()
