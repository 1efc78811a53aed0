"""With ``--num-workers`` >= 1 (fairseq's default is 1), data drawn per epoch is drawn
once: the same masks and sentence pairs every epoch; redraw them.

Bug (fairseq 0.12.2): datasets whose items change with the epoch but whose sizes do not
(fairseq's ``MaskTokensDataset``, so ``--task masked_lm``'s dynamic masking, RoBERTa's)
say ``can_reuse_epoch_itr_across_epochs``, so
``FairseqTask.get_batch_iterator`` hands back the same ``EpochBatchIterator`` every epoch,
and that iterator reuses its ``DataLoader`` (``reuse_dataloader``) whose worker processes
persist (``persistent_workers``). ``next_epoch_itr`` calls ``set_epoch`` on the dataset of
the main process only; the workers keep the copy they forked in the first epoch, whose
epoch stays 1. With ``--num-workers 0`` the main process reads its own dataset and every
epoch is redrawn, so the same command gives different data with and without workers.

Fix: ``EpochBatchIterator.next_epoch_itr`` is wrapped: when it moves the dataset to a new
epoch (``set_dataset_epoch``), a reused ``DataLoader`` with workers exists, and the
dataset's items depend on the epoch, that loader's workers are shut down and the loader
dropped, so fairseq builds a new one whose workers start from the dataset of the new epoch
(what it does when the loader is not reused). Validation iterators
(``set_dataset_epoch=False``: the same masks at every validation, by design) keep their
loader. It changes what is trained, so it is installed only with
``REALFORMER_NMT_DATA_FIXES=1`` (``realformer_tools.fairseq_fixes``).

Items depend on the epoch where the dataset, or a dataset it wraps (found by walking its
attributes once per iterator), is one of :data:`EPOCH_DEPENDENT` (fairseq's dynamic
masking and denoising noise) or says ``items_depend_on_epoch = True``. (This project's
``masked_lm_nsp`` needs none of it: its datasets say they cannot reuse an epoch's
iterator, fairseq's own remedy, so its pairs and masks are redrawn with or without this
fix.) Every ``FairseqDataset`` has a ``set_epoch``, most of them a no-op: ``--task
translation`` serves the same items every epoch, so its workers are kept (re-forking them
cost ~0.2 s of a 0.4-0.5 s epoch on a small corpus).

When it is no longer needed: with the patch uninstalled, the first batch of
``task.get_batch_iterator(dataset, num_workers=1, epoch=e).next_epoch_itr(shuffle=False)``
differs between e = 1, 2, 3 for ``--task masked_lm`` (``tests/test_pretraining_epochs.py``
checks what fairseq does alone).
"""

import functools
import logging

import torch
from fairseq.data import DenoisingDataset, MaskTokensDataset, iterators
from fairseq.data.span_mask_tokens_dataset import SpanMaskedTokensDataset

logger = logging.getLogger(__name__)

# fairseq datasets whose items are drawn from (seed, epoch, index)
EPOCH_DEPENDENT = (MaskTokensDataset, DenoisingDataset, SpanMaskedTokensDataset)
_MAX_CONTAINER = 1000  # lists / dicts longer than this hold data, not datasets


def items_depend_on_epoch(dataset, _seen=None) -> bool:
    """Whether ``dataset`` or any dataset inside it draws its items per epoch."""
    seen = set() if _seen is None else _seen
    if id(dataset) in seen:
        return False
    seen.add(id(dataset))
    if isinstance(dataset, EPOCH_DEPENDENT) or getattr(dataset, "items_depend_on_epoch", False) is True:
        return True
    for child in _children(dataset):
        if items_depend_on_epoch(child, seen):
            return True
    return False


def _children(dataset):
    for value in getattr(dataset, "__dict__", {}).values():
        if isinstance(value, dict):
            values = value.values() if len(value) <= _MAX_CONTAINER else ()
        elif isinstance(value, (list, tuple)):
            values = value if len(value) <= _MAX_CONTAINER else ()
        else:
            values = (value,)
        for v in values:
            if isinstance(v, torch.utils.data.Dataset):
                yield v


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
                and self.next_epoch_idx != self.epoch and _epoch_dependent(self)):
            close_workers(loader)
            self.dataloader = None
        return next_epoch_itr(self, shuffle=shuffle, fix_batches_to_gpus=fix_batches_to_gpus,
                              set_dataset_epoch=set_dataset_epoch)

    wrapper.__realformer_fixed__ = True
    return wrapper


def _epoch_dependent(itr) -> bool:
    """``items_depend_on_epoch(itr.dataset)``, decided once per iterator."""
    answer = getattr(itr, "_realformer_epoch_dependent", None)
    if answer is None:
        answer = hasattr(itr.dataset, "set_epoch") and items_depend_on_epoch(itr.dataset)
        itr._realformer_epoch_dependent = answer
    return answer


# what install() replaces (module:attribute, as fairseq looks it up) and what that changes, for the
# launcher's log line and its restoring (realformer_tools.fairseq_fixes.fixes_installed)
REPLACES = (
    "fairseq.data.iterators:EpochBatchIterator.next_epoch_itr",
)
CHANGES = ("with DataLoader workers, data drawn per epoch (masked_lm's masks) is redrawn each epoch")


def install():
    cls = iterators.EpochBatchIterator
    if not getattr(cls.next_epoch_itr, "__realformer_fixed__", False):
        cls.next_epoch_itr = fresh_workers_each_epoch(cls.next_epoch_itr)


def uninstall():
    """Restore fairseq's own method (tests use this to see what fairseq does alone)."""
    cls = iterators.EpochBatchIterator
    if getattr(cls.next_epoch_itr, "__realformer_fixed__", False):
        cls.next_epoch_itr = cls.next_epoch_itr.__wrapped__
