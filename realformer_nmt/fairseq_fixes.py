"""fairseq 0.12 bugs that lose data or crash a finished run; fixed on import of the plugin.

1. ``data_utils.batch_by_size`` drops the last batch when its size is not a multiple
   of ``--required-batch-size-multiple`` (default 8): ``fairseq-generate`` leaves up to
   7 test sentences untranslated, without a word, and BLEU is scored on the rest
   (fairseq issue #5036). The remainder is kept as a final, smaller batch.
2. ``fairseq-interactive`` decodes its input strictly: one invalid UTF-8 byte raises
   ``UnicodeDecodeError`` and the translations of the lines around it are lost.
   Undecodable bytes become U+FFFD (translated as ``<unk>``), with a warning per line.
3. ``BufferedIterator`` makes batches in a daemon thread. When a run ends mid-epoch
   (``--max-update``, the last validation batch) that thread may be inside a torch op
   with the GIL released; at interpreter exit CPython ends it with ``pthread_exit``,
   whose unwinding through torch's ``noexcept`` GIL guard calls ``std::terminate``:
   ``fairseq-train`` prints "terminate called without an active exception" and exits
   with SIGABRT after a successful run. The threads are stopped before exit instead.
"""

import atexit
import fileinput
import functools
import logging
import queue
import sys
import time
import weakref

import numpy as np

import fairseq_cli.interactive
from fairseq.data import data_utils, iterators

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


_consumers = weakref.WeakSet()


def tracking_consumers(create_consumer):
    @functools.wraps(create_consumer)
    def wrapper(self):
        create_consumer(self)
        _consumers.add(self._consumer)

    wrapper.__realformer_fixed__ = True
    return wrapper


def stop_background_consumers(timeout=10.0):
    """Let every batch-making thread finish its batch in flight and end (at exit)."""
    deadline = time.monotonic() + timeout
    for consumer in list(_consumers):
        consumer._max_len = 0  # its loop breaks after the next put
        while consumer.is_alive() and time.monotonic() < deadline:
            try:  # make room for that put and for the sentinel after it
                while True:
                    consumer._queue.get_nowait()
            except queue.Empty:
                pass
            consumer.join(0.01)


def install():
    if not getattr(data_utils.batch_by_size, "__realformer_fixed__", False):
        data_utils.batch_by_size = keep_last_partial_batch(data_utils.batch_by_size)
    fairseq_cli.interactive.buffered_read = buffered_read
    create_consumer = iterators.BufferedIterator._create_consumer
    if not getattr(create_consumer, "__realformer_fixed__", False):
        iterators.BufferedIterator._create_consumer = tracking_consumers(create_consumer)
        atexit.register(stop_background_consumers)


install()
