"""A finished ``fairseq-train``/``fairseq-generate`` can die with SIGABRT at exit; stop
fairseq's batch-making threads first.

Bug (fairseq 0.12 on CPython >= 3.11): ``BufferedIterator`` makes batches in a daemon
thread. When a run ends mid-epoch (``--max-update``, the last validation batch) that
thread may be inside a torch op with the GIL released; at interpreter exit CPython ends
it with ``pthread_exit``, whose unwinding through torch's ``noexcept`` GIL guard calls
``std::terminate``: the run prints "terminate called without an active exception" and
exits with status 134 after succeeding.

Fix: the threads are tracked and, at exit, each finishes its batch in flight and ends
(bounded at 10 s; a wait of more than a second is said on stderr, so that a slow exit of a
finished run shows whether this handler was the wait: on the CPU it takes ~0.01 s).

When it is no longer needed: ``tests/test_reliability_resume.py`` runs fairseq's own
``BufferedIterator`` without the patch and expects the abort; it fails (telling us)
once fairseq or CPython stops aborting.
"""

import atexit
import functools
import queue
import sys
import time
import weakref

from fairseq.data import iterators

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
    start = time.monotonic()
    deadline = start + timeout
    consumers = list(_consumers)
    _stop(consumers, deadline)
    waited = time.monotonic() - start
    if waited > 1.0:
        alive = sum(c.is_alive() for c in consumers)
        try:
            sys.stderr.write(f"realformer_nmt: at exit, waited {waited:.1f}s for fairseq's batch threads "
                             f"({alive} of {len(consumers)} still running)\n")
        except (OSError, ValueError):
            pass


def _stop(consumers, deadline):
    for consumer in consumers:
        consumer._max_len = 0  # its loop breaks after the next put
        while consumer.is_alive() and time.monotonic() < deadline:
            try:  # make room for that put and for the sentinel after it
                while True:
                    consumer._queue.get_nowait()
            except queue.Empty:
                pass
            consumer.join(0.01)


# what install() replaces (module:attribute, as fairseq looks it up) and what that changes, for the
# launcher's log line and its restoring (realformer_tools.fairseq_fixes.fixes_installed)
REPLACES = (
    "fairseq.data.iterators:BufferedIterator._create_consumer",
)
EXIT_HOOK = "stop_background_consumers"  # the exit hook install() registers (by name: defined below)
CHANGES = ("fairseq's batch threads are stopped at exit (an exit hook): no SIGABRT after a finished run")


def install():
    create_consumer = iterators.BufferedIterator._create_consumer
    if not getattr(create_consumer, "__realformer_fixed__", False):
        iterators.BufferedIterator._create_consumer = tracking_consumers(create_consumer)
        atexit.register(stop_background_consumers)
