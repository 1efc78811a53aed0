"""fairseq_patches: installed from one place, once; the numpy 2 alias fix."""

import numpy as np
import torch

from fairseq.data import LanguagePairDataset, TokenBlockDataset

from realformer_nmt import fairseq_patches

from conftest import make_dictionary


def test_every_patch_module_documents_its_bug_and_when_to_drop_it():
    for patch in fairseq_patches.PATCHES:
        doc = patch.__doc__ or ""
        assert "fairseq" in doc and "no longer needed" in doc, patch.__name__
        assert callable(patch.install), patch.__name__


def test_install_all_is_idempotent():
    before = np.compat.long
    fairseq_patches.install_all()
    fairseq_patches.install_all()
    assert np.compat.long is before


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
