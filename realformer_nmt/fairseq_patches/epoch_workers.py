"""With ``--num-workers`` >= 1 (fairseq's default is 1), data drawn per epoch is drawn
once: the same masks and sentence pairs every epoch; redraw them.

Bug (fairseq 0.12.2): datasets whose items change with the epoch but whose sizes do not
(fairseq's ``MaskTokensDataset``, so ``--task masked_lm``'s dynamic masking, RoBERTa's;
this project's ``masked_lm_nsp`` pairs) say ``can_reuse_epoch_itr_across_epochs``, so
``FairseqTask.get_batch_iterator`` hands back the same ``EpochBatchIterator`` every epoch,
and that iterator reuses its ``DataLoader`` (``reuse_dataloader``) whose worker processes
persist (``persistent_workers``). ``next_epoch_itr`` calls ``set_epoch`` on the dataset of
the main process only; the workers keep the copy they forked in the first epoch, whose
epoch stays 1. With ``--num-workers 0`` the main process reads its own dataset and every
epoch is redrawn, so the same command gives different data with and without workers.

Fix: ``EpochBatchIterator.next_epoch_itr`` is wrapped: when it moves the dataset to a new
epoch (``set_dataset_epoch``) and a reused ``DataLoader`` with workers exists, that
loader's workers are shut down and the loader dropped, so fairseq builds a new one whose
workers start from the dataset of the new epoch (what it does when the loader is not
reused). Validation iterators (``set_dataset_epoch=False``: the same masks at every
validation, by design) keep their loader.

When it is no longer needed: with the patch uninstalled, the first batch of
``task.get_batch_iterator(dataset, num_workers=1, epoch=e).next_epoch_itr(shuffle=False)``
differs between e = 1, 2, 3 for ``--task masked_lm`` (``tests/test_pretraining_epochs.py``
checks what fairseq does alone).
"""

import functools
import logging

from fairseq.data import iterators

logger = logging.getLogger(__name__)


def close_workers(dataloader):
    iterator = getattr(dataloader, "_iterator", None)  # the persistent workers' iterator
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()


def fresh_workers_each_epoch(next_epoch_itr):
    @functools.wraps(next_epoch_itr)
    def wrapper(self, shuffle=True, fix_batches_to_gpus=False, set_dataset_epoch=True):
        loader = getattr(self, "dataloader", None)
        if (set_dataset_epoch and loader is not None and self.num_workers > 0
                and self.next_epoch_idx != self.epoch and hasattr(self.dataset, "set_epoch")):
            close_workers(loader)
            self.dataloader = None
        return next_epoch_itr(self, shuffle=shuffle, fix_batches_to_gpus=fix_batches_to_gpus,
                              set_dataset_epoch=set_dataset_epoch)

    wrapper.__realformer_fixed__ = True
    return wrapper


def install():
    cls = iterators.EpochBatchIterator
    if not getattr(cls.next_epoch_itr, "__realformer_fixed__", False):
        cls.next_epoch_itr = fresh_workers_each_epoch(cls.next_epoch_itr)


def uninstall():
    """Restore fairseq's own method (tests use this to see what fairseq does alone)."""
    cls = iterators.EpochBatchIterator
    if getattr(cls.next_epoch_itr, "__realformer_fixed__", False):
        cls.next_epoch_itr = cls.next_epoch_itr.__wrapped__
