"""realformer_tools.fairseq_fixes: each documents its bug; installing them again replaces
nothing; the numpy 2 alias fix."""

import atexit

import fairseq_cli.eval_lm
import fairseq_cli.generate
import fairseq_cli.interactive
import fairseq_cli.preprocess
import fairseq_cli.train
import fairseq_cli.validate
import numpy as np
import torch
from conftest import make_dictionary
from fairseq import checkpoint_utils, options
from fairseq.data import (
    LanguagePairDataset,
    TokenBlockDataset,
    bucket_pad_length_dataset,
    data_utils,
    indexed_dataset,
    iterators,
)
from fairseq.distributed import utils as distributed_utils
from fairseq.file_io import PathManager
from fairseq.models import distributed_fairseq_model
from fairseq.models.fairseq_model import BaseFairseqModel
from fairseq.tasks.translation import TranslationTask
from fairseq.trainer import Trainer

from realformer_tools import fairseq_fixes as fairseq_patches
from realformer_tools.fairseq_fixes import interactive_utf8, numpy2_compat
from realformer_tools.launch import fixes_installed


def test_every_patch_module_documents_its_bug_and_when_to_drop_it():
    for patch in fairseq_patches.PATCHES:
        doc = patch.__doc__ or ""
        assert "fairseq" in doc and "no longer needed" in doc, patch.__name__
        assert callable(patch.install), patch.__name__


def replaced_objects():
    """What each patch puts in place, read where fairseq (or numpy) looks it up."""
    return {
        "safe_checkpoint_loading": (checkpoint_utils.load_checkpoint_to_cpu,
                                    checkpoint_utils.load_model_ensemble_and_task),
        "atomic_checkpoint_copies": (PathManager.__dict__["copy"].__func__,),
        "keep_last_batch": (data_utils.batch_by_size,),
        "interactive_utf8": (fairseq_cli.interactive.buffered_read,),
        "batch_thread_exit": (iterators.BufferedIterator.__dict__["_create_consumer"],),
        "data_dir_checks": (TranslationTask.__dict__["setup_task"].__func__, indexed_dataset.make_dataset),
        "bf16_without_tpu": (options.parse_args_and_arch, Trainer.__dict__["__init__"]),
        "bf16_decoding": (BaseFairseqModel.__dict__["prepare_for_inference_"], fairseq_cli.generate.main,
                          fairseq_cli.interactive.main, fairseq_cli.eval_lm.main),
        "preprocess_checks": (fairseq_cli.preprocess.main,),
        "numpy2_compat": (np.compat, np.compat.long, data_utils.get_buckets, bucket_pad_length_dataset.get_buckets),
        "epoch_workers": (iterators.EpochBatchIterator.__dict__["next_epoch_itr"],),
        "resume_batches": (Trainer.__dict__["get_train_iterator"],),
        "cpu_distributed": (distributed_fairseq_model.DistributedDataParallel, distributed_utils.call_main),
        "arch_choices": (options.add_model_args,),
        "train_preflight": (fairseq_cli.train.main, fairseq_cli.train.convert_namespace_to_omegaconf,
                            fairseq_cli.generate.convert_namespace_to_omegaconf,
                            fairseq_cli.validate.convert_namespace_to_omegaconf),
    }


def test_installing_again_replaces_nothing():
    """With every group of fixes installed (the launcher's ``fixes_installed``), installing
    them again (twice) leaves every replaced object as it is: no second wrapper, no second
    exit hook, no second allow-list entry."""
    with fixes_installed(data_fixes=True, bf16_decoding=True, every_sentence=True, quiet=True):
        _check_installing_again()


def _check_installing_again():
    # the patches are in place (an install that did nothing would pass trivially below)
    assert checkpoint_utils.load_checkpoint_to_cpu.__realformer_safe__
    assert PathManager.copy.__realformer_atomic__
    assert data_utils.batch_by_size.__realformer_fixed__
    assert fairseq_cli.interactive.buffered_read.__module__ == interactive_utf8.__name__
    assert iterators.BufferedIterator._create_consumer.__realformer_fixed__
    assert TranslationTask.setup_task.__func__._checks_data
    assert np.compat.long is np.int64
    assert iterators.EpochBatchIterator.next_epoch_itr.__realformer_fixed__
    assert fairseq_cli.generate.main.__realformer_fixed__
    assert distributed_fairseq_model.DistributedDataParallel.__realformer_fixed__
    before = replaced_objects()
    assert set(before) == {patch.__name__.rsplit(".", 1)[1] for patch in fairseq_patches.PATCHES} - {"one_line_errors"}
    exit_hooks = atexit._ncallbacks()
    safe_globals = list(torch.serialization.get_safe_globals())

    for _ in range(2):
        fairseq_patches.install_for_good(data_fixes=True, bf16_decoding=True, every_sentence=True)

    after = replaced_objects()
    replaced_again = [name for name, objects in before.items()
                      if any(a is not b for a, b in zip(after[name], objects))]
    assert not replaced_again
    assert atexit._ncallbacks() == exit_hooks  # batch_thread_exit's hook registered once
    assert torch.serialization.get_safe_globals() == safe_globals
    assert not getattr(data_utils.batch_by_size.__wrapped__, "__realformer_fixed__", False)  # wrapped once
    assert not getattr(iterators.BufferedIterator._create_consumer.__wrapped__, "__realformer_fixed__", False)
    assert not getattr(iterators.EpochBatchIterator.next_epoch_itr.__wrapped__, "__realformer_fixed__", False)
    assert not getattr(fairseq_cli.generate.main.__wrapped__, "__realformer_fixed__", False)


def test_numpy2_alias_is_created_once_where_numpy_lacks_it(monkeypatch):
    """numpy >= 2 has no ``numpy.compat``: install defines ``numpy.compat.long`` as
    ``numpy.int64`` (what it was on 64-bit Linux); a second install keeps that module."""
    monkeypatch.delattr(np, "compat", raising=False)  # restored after the test
    numpy2_compat.install()
    created = np.compat
    assert created.long is np.int64
    numpy2_compat.install()
    assert np.compat is created and np.compat.long is np.int64


def test_token_blocks_break_at_eos_under_numpy_2():
    """--sample-break-mode eos (masked_lm, language_modeling): one block per sentence."""
    tokens = [torch.tensor([4, 5, 2]), torch.tensor([6, 2]), torch.tensor([7, 8, 9, 2])]
    ds = TokenBlockDataset(tokens, np.array([3, 2, 4]), block_size=None, pad=1, eos=2, break_mode="eos")
    assert [ds[i].tolist() for i in range(len(ds))] == [t.tolist() for t in tokens]


def test_batch_buckets_under_numpy_2():
    """--num-batch-buckets (translation) buckets source lengths."""
    d = make_dictionary()
    src = [torch.tensor([4, 5, 2]), torch.tensor([6, 7, 8, 9, 10, 2])]
    ds = LanguagePairDataset(src, np.array([3, 6]), d, tgt=src, tgt_sizes=np.array([3, 6]), tgt_dict=d,
                             num_buckets=2)
    assert len(ds.buckets) >= 1 and all(n >= 3 for _, n in ds.buckets)


def test_a_program_that_configured_logging_keeps_it():
    """fairseq's imports call logging.basicConfig (DEBUG, INFO), which does nothing where a
    program configured logging first, as every fairseq-* command does before ``--user-dir``
    loads the plugin: importing realformer_nmt leaves it so.
    (What a bare import does to the root logger, that is fairseq's imports' doing, is in
    tests/test_import_changes_nothing.py.)"""
    import os
    import subprocess
    import sys

    configured = ("import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stdout); "
                  "import realformer_nmt; root = logging.getLogger(); "
                  "print(len(root.handlers), logging.getLevelName(root.level))")
    proc = subprocess.run([sys.executable, "-c", configured], capture_output=True, text=True, timeout=300,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert proc.stdout.strip().splitlines()[-1] == "1 INFO", proc.stdout
    # fairseq's import-time "Please install tensorboardX" (a speech task's INFO line) is not printed, also
    # where fairseq is imported with INFO logging on before any plugin loads, as every fairseq-* command does
    assert "Please install tensorboardX" not in proc.stdout + proc.stderr
    fairseq_cli = ("import logging, sys; logging.basicConfig(level=logging.INFO, stream=sys.stdout); "
                   "import fairseq.tasks, fairseq.models; print('imported')")
    proc = subprocess.run([sys.executable, "-c", fairseq_cli], capture_output=True, text=True, timeout=300)
    assert proc.stdout.strip().splitlines()[-1] == "imported", proc.stdout + proc.stderr
    assert "Please install tensorboardX" not in proc.stdout + proc.stderr

