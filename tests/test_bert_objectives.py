"""The pre-training criterions: MLM accuracy (``masked_lm_acc``) and MLM + NSP
(``masked_lm_nsp``) against counts and losses computed by hand."""

import math
import types

import pytest
import torch
import torch.nn.functional as F
from bert_helpers import bert_batch, bert_dictionary, build_bert
from fairseq.criterions.masked_lm import MaskedLmConfig, MaskedLmLoss
from fairseq.logging import metrics

from realformer_nmt.criterions.masked_lm_acc import MaskedLmAccuracyLoss
from realformer_nmt.criterions.masked_lm_nsp import MaskedLmNspConfig, MaskedLmNspLoss
from realformer_nmt.errors import ConfigError
from realformer_nmt.tasks.masked_lm_nsp import NSP_HEAD


@pytest.fixture(params=["realformer_bert", "roberta"])
def setup(request):
    """(dictionary, task, model) for our model and fairseq's RoBERTa (the baselines use
    the same criterions)."""
    d = bert_dictionary()
    task = types.SimpleNamespace(source_dictionary=d, target_dictionary=d, nsp_head=NSP_HEAD)
    model = build_bert(request.param, dictionary=d, seed=11)
    model.register_classification_head(NSP_HEAD, num_classes=2)
    model.eval()
    return d, task, model


def masked_sample(model, d, seed, n_right, bsz=4, length=12):
    """A batch whose MLM targets are right at exactly ``n_right`` masked positions.

    Positions to predict are chosen at random; the target there is the model's own
    top token for the first ``n_right`` of them, another token for the rest, so the
    expected accuracy is known by construction (and recounted by hand in the tests)."""
    g = torch.Generator().manual_seed(seed)
    src = bert_batch(d, bsz=bsz, length=length, seed=seed)
    selected = (torch.rand(src.shape, generator=g) < 0.3) & src.ne(d.pad())
    selected[0, 1] = True
    src = src.masked_fill(selected, len(d) - 1)  # <mask>
    with torch.no_grad():
        top = model(src)[0].argmax(-1)
    target = torch.full_like(src, d.pad())
    positions = selected.nonzero().tolist()
    assert len(positions) > n_right
    for k, (b, t) in enumerate(positions):
        right = int(top[b, t])
        wrong = d.nspecial + (right - d.nspecial + 1) % (len(d) - 1 - d.nspecial)
        target[b, t] = right if k < n_right else wrong
    sample = {
        "id": torch.arange(bsz),
        "net_input": {"src_tokens": src, "src_lengths": src.ne(d.pad()).sum(1)},
        "target": target,
        "nsentences": bsz,
        "ntokens": int(src.ne(d.pad()).sum()),
    }
    return sample, len(positions)


def hand_count(model, sample, pad):
    logits = model(sample["net_input"]["src_tokens"])[0]
    right = total = 0
    for b, t in sample["target"].ne(pad).nonzero().tolist():
        total += 1
        right += int(logits[b, t].argmax() == sample["target"][b, t])
    return right, total


def reduced(criterion_cls, logging_outputs):
    with metrics.aggregate(new_root=True) as agg:
        criterion_cls.reduce_metrics(logging_outputs)
        return agg.get_smoothed_values()


def test_mlm_accuracy_equals_a_hand_count(setup):
    d, task, model = setup
    criterion = MaskedLmAccuracyLoss(MaskedLmConfig(tpu=False), task)
    outputs, expected_right, expected_total = [], 0, 0
    for seed, n_right in ((1, 3), (2, 7)):
        sample, n_masked = masked_sample(model, d, seed, n_right)
        _, _, log = criterion(model, sample)
        right, total = hand_count(model, sample, d.pad())
        assert (right, total) == (n_right, n_masked)
        assert (int(log["mlm_correct"]), log["mlm_total"]) == (right, total)
        outputs.append(log)
        expected_right, expected_total = expected_right + right, expected_total + total
    # summed over batches, not averaged per batch
    assert reduced(MaskedLmAccuracyLoss, outputs)["mlm_accuracy"] == round(100 * expected_right / expected_total, 3)


def test_masked_lm_acc_keeps_fairseqs_masked_lm_loss(setup):
    d, task, model = setup
    sample, _ = masked_sample(model, d, 3, 2)
    ours = MaskedLmAccuracyLoss(MaskedLmConfig(tpu=False), task)(model, sample)
    theirs = MaskedLmLoss(MaskedLmConfig(tpu=False), task)(model, sample)
    assert ours[0].item() == theirs[0].item() and ours[1] == theirs[1]
    assert reduced(MaskedLmAccuracyLoss, [ours[2]])["loss"] == reduced(MaskedLmLoss, [theirs[2]])["loss"]


def test_mlm_nsp_loss_and_accuracies_equal_hand_computation(setup):
    d, task, model = setup
    criterion = MaskedLmNspLoss(MaskedLmNspConfig(nsp_loss_weight=0.5), task)
    sample, n_masked = masked_sample(model, d, 4, 5)
    src = sample["net_input"]["src_tokens"]
    with torch.no_grad():
        nsp_logits = model(src, classification_head_name=NSP_HEAD)[0]
    nsp_top = nsp_logits.argmax(-1)
    sample["nsp_target"] = torch.tensor([nsp_top[0], nsp_top[1], 1 - nsp_top[2], nsp_top[3]])  # 3 of 4 right

    loss, sample_size, log = criterion(model, sample)

    lm_logits = model(src)[0]
    keep = sample["target"].ne(d.pad())
    mlm = F.cross_entropy(lm_logits[keep], sample["target"][keep])  # mean over masked tokens
    nsp = F.cross_entropy(nsp_logits, sample["nsp_target"])  # mean over pairs
    torch.testing.assert_close(loss, mlm + 0.5 * nsp)
    assert sample_size == 1
    assert (int(log["mlm_correct"]), log["mlm_total"]) == (5, n_masked)
    assert int(log["nsp_correct"]) == 3 and log["nsentences"] == 4

    values = reduced(MaskedLmNspLoss, [log])
    assert values["mlm_accuracy"] == round(100 * 5 / n_masked, 3)
    assert values["nsp_accuracy"] == 75.0
    assert values["mlm_loss"] == pytest.approx(mlm.item() / math.log(2), abs=1e-3)
    assert values["nsp_loss"] == pytest.approx(nsp.item() / math.log(2), abs=1e-3)


def test_nsp_criterion_without_nsp_batches_is_a_clear_error(setup):
    d, task, model = setup
    sample, _ = masked_sample(model, d, 5, 1)
    with pytest.raises(ConfigError, match="--criterion masked_lm_nsp needs --task masked_lm_nsp"):
        MaskedLmNspLoss(MaskedLmNspConfig(), task)(model, sample)
