"""A run resumed from a checkpoint in epoch 2 or later trains on other batches than the same
run never stopped; build them as the run that never stopped built them.

Bug (fairseq 0.12.2): ``FairseqTask.get_batch_iterator`` groups the sentences into batches
once, when it creates the training iterator, breaking ties between sentences of equal
length with a permutation drawn under ``numpy_seed(seed + epoch)``, and where the dataset
allows it (``can_reuse_epoch_itr_across_epochs``, e.g. ``--task translation``) every later
epoch reuses those batches and only shuffles their order. A run started from
scratch creates the iterator in epoch 1; a run resumed from ``checkpoint_last.pt`` creates it
in the epoch it resumes in. From there on sentences of equal length sit in other batches and
in another order inside them, so dropout falls on other positions and the run drifts away
from the one that was never stopped. Measured on 300 Multi30k sentences
(``tests/test_compare_backbones.py``): resumed in epoch 1, the parameters after 22 updates
equal the uninterrupted run's bit for bit; resumed at the start of epoch 2, 87 of 89
tensors differ, although the two runs' parameters were equal when the second one stopped.
(``--task masked_lm`` orders its sentences itself, under ``numpy_seed(seed)``, so its
batches do not depend on the epoch unless ``--update-ordered-indices-seed`` makes the seed
depend on it.)

Fix: ``Trainer.get_train_iterator``, asked for epoch ``e`` > 1 when it has no iterator to
reuse (a resumed run's first call), builds the iterator as in epoch 1 (its seed included)
and then moves it (and the dataset) to epoch ``e``: exactly the iterator an uninterrupted
run holds when it reaches epoch ``e``. ``load_state_dict`` then fast-forwards it as before.
It acts only where fairseq would reuse the iterator across epochs: with data split into
shards (each epoch reads another shard), ``disable_iterator_cache``, ``--update-epoch-batch-
itr`` or ``rebuild_batches`` it passes the call through, and where the loaded dataset turns
out not to reuse its iterator (or the task gives a batch sampler that rebuilds per epoch) it
drops the epoch-1 build and makes the call fairseq alone makes; there both runs build the
batches in the same epoch and nothing changes. Later calls (the iterator handed back at each
epoch's end, or a dataset built anew each epoch) pass through. It changes what a resumed run
trains on, so it is installed only with ``REALFORMER_NMT_DATA_FIXES=1``
(``realformer_tools.fairseq_fixes``).

When it is no longer needed: with the patch uninstalled, ``fairseq-train`` stopped at the
end of epoch 1 and resumed ends with the parameters of the same command never stopped
(``tests/test_compare_backbones.py::test_resumed_run_is_bit_identical_to_an_uninterrupted_one``
checks both).
"""

import functools

from fairseq.trainer import Trainer


def _reused_across_epochs(trainer, disable_iterator_cache):
    """Whether fairseq builds this run's training batches once and reuses them every epoch,
    as far as can be told before the dataset is loaded."""
    task, subset = trainer.task, trainer.cfg.dataset.train_subset
    return not (disable_iterator_cache or trainer.cfg.dataset.update_epoch_batch_itr
                or getattr(task.cfg, "rebuild_batches", False) or task.has_sharded_data(subset))


def _fairseq_builds_as_asked(trainer, load_dataset):
    """Whether this call is one fairseq answers the same in a resumed and an uninterrupted
    run: the training data is loaded already and either has its iterator from an earlier
    epoch (handed back as it is) or cannot reuse one (built anew every epoch)."""
    task = trainer.task
    dataset = task.datasets.get(trainer.cfg.dataset.train_subset)
    return not load_dataset and dataset is not None and (
        dataset in task.dataset_to_epoch_iter or not task.can_reuse_epoch_itr(dataset))


def built_as_in_epoch_one(get_train_iterator):
    @functools.wraps(get_train_iterator)
    def wrapper(self, epoch, combine=True, load_dataset=True, data_selector=None, shard_batch_itr=True,
                disable_iterator_cache=False):
        kwargs = dict(combine=combine, data_selector=data_selector, shard_batch_itr=shard_batch_itr,
                      disable_iterator_cache=disable_iterator_cache)
        if epoch <= 1 or not _reused_across_epochs(self, disable_iterator_cache) or \
                _fairseq_builds_as_asked(self, load_dataset):
            return get_train_iterator(self, epoch, load_dataset=load_dataset, **kwargs)
        iterator = get_train_iterator(self, 1, load_dataset=load_dataset, **kwargs)
        subset = self.cfg.dataset.train_subset
        dataset = self.task.dataset(subset)
        if not self.task.can_reuse_epoch_itr(dataset) or callable(getattr(iterator, "batch_sampler", None)):
            # batches built anew each epoch (a dataset that cannot reuse its iterator, a task's own
            # batch sampler): forget the epoch-1 build and do what fairseq alone does in this epoch
            self.task.dataset_to_epoch_iter.pop(dataset, None)
            if load_dataset:  # some tasks refuse to load a split twice (translation_multi_simple_epoch)
                self.task.datasets.pop(subset, None)
            return get_train_iterator(self, epoch, load_dataset=load_dataset, **kwargs)
        # what an uninterrupted run's iterator is on reaching this epoch (EpochBatchIterator
        # keeps the epoch it was created in as ``epoch``; next_epoch_itr moves the dataset)
        iterator.epoch = epoch
        dataset.set_epoch(epoch)
        return iterator

    wrapper.__realformer_fixed__ = True
    return wrapper


# what install() replaces (module:attribute, as fairseq looks it up) and what that changes, for the
# launcher's log line and its restoring (realformer_tools.fairseq_fixes.fixes_installed)
REPLACES = (
    "fairseq.trainer:Trainer.get_train_iterator",
)
CHANGES = ("a run resumed in epoch >= 2 trains on the batches the run never stopped would have")


def install():
    if not getattr(Trainer.get_train_iterator, "__realformer_fixed__", False):
        Trainer.get_train_iterator = built_as_in_epoch_one(Trainer.get_train_iterator)
