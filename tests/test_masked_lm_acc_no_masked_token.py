"""``masked_lm_acc`` on a batch with no masked token, the way fairseq's ``masked_lm``
criterion handles it on an accelerator: it then projects *every* position through a
``[B, T]`` all-True selection, so the logits arrive flattened as ``[B * T, V]`` while the
target stays ``[B, T]`` (on CPU fairseq passes ``masked_tokens=None`` instead and the
logits are ``[B, T, V]``). Both must count 0 of 0 and keep fairseq's loss (0)."""

import types

import pytest
import torch
from bert_helpers import bert_batch, bert_dictionary, build_bert
from fairseq.criterions.masked_lm import MaskedLmConfig, MaskedLmLoss

from realformer_nmt.criterions.masked_lm_acc import MaskedLmAccuracyLoss, count_correct


class _AcceleratorBranch:
    """The model as fairseq's criterion drives it on CUDA when nothing is masked: the
    CPU branch's ``masked_tokens=None`` becomes the all-True ``[B, T]`` mask that
    ``torch.where(masked.any(), masked, masked.new([True]))`` broadcasts to there."""

    def __init__(self, model):
        self.model, self.calls = model, []

    def __call__(self, src_tokens, masked_tokens=None, **kwargs):
        if masked_tokens is None:
            masked_tokens = torch.ones_like(src_tokens, dtype=torch.bool)
        self.calls.append(tuple(masked_tokens.shape))
        return self.model(src_tokens, masked_tokens=masked_tokens, **kwargs)

    def __getattr__(self, name):
        return getattr(self.model, name)


@pytest.fixture(params=["realformer_bert", "roberta"])
def unmasked_batch(request):
    d = bert_dictionary()
    model = build_bert(request.param, dictionary=d, seed=3)
    src = bert_batch(d, bsz=3, length=8)
    sample = {"id": torch.arange(3), "net_input": {"src_tokens": src, "src_lengths": src.ne(d.pad()).sum(1)},
              "target": torch.full_like(src, d.pad()),  # nothing to predict
              "nsentences": 3, "ntokens": int(src.ne(d.pad()).sum())}
    task = types.SimpleNamespace(source_dictionary=d, target_dictionary=d)
    return d, task, model, sample


def test_accuracy_counts_nothing_when_every_position_was_projected_flattened(unmasked_batch):
    d, task, model, sample = unmasked_batch
    wrapped = _AcceleratorBranch(model)
    loss, sample_size, log = MaskedLmAccuracyLoss(MaskedLmConfig(tpu=False), task)(wrapped, sample)
    assert wrapped.calls == [(3, 8)]  # the accelerator branch really ran
    assert (int(log["mlm_correct"]), log["mlm_total"]) == (0, 0)
    assert loss.item() == 0.0 and int(sample_size) == 0
    # fairseq's own criterion on the same branch gives the same loss
    theirs = MaskedLmLoss(MaskedLmConfig(tpu=False), task)(_AcceleratorBranch(model), sample)
    assert theirs[0].item() == loss.item()


def test_accuracy_counts_nothing_on_the_cpu_branch_too(unmasked_batch):
    d, task, model, sample = unmasked_batch
    _, _, log = MaskedLmAccuracyLoss(MaskedLmConfig(tpu=False), task)(model, sample)
    assert (int(log["mlm_correct"]), log["mlm_total"]) == (0, 0)


def test_count_correct_accepts_every_logits_layout_fairseq_produces():
    target = torch.tensor([[1, 5, 1], [7, 1, 6]])  # pad = 1: masked at (0,1), (1,0), (1,2)
    full = torch.zeros(2, 3, 10)
    full[0, 1, 5] = full[1, 0, 3] = full[1, 2, 6] = 1.0  # right, wrong, right
    masked = target.ne(1)
    layouts = {"masked rows": full[masked], "[B, T, V]": full, "[B*T, V]": full.reshape(6, 10)}
    for name, logits in layouts.items():
        correct, total = count_correct(logits, target, padding_idx=1)
        assert (int(correct), total) == (2, 3), name
