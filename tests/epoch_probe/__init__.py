"""A ``--user-dir`` for tests: the realformer_nmt plugin plus two criterions that write,
for every training batch, a hash of each sample (input tokens, MLM targets, NSP label)
to the file named by ``EPOCH_PROBE_OUT``, one JSON line per batch. Used to see what
``fairseq-train`` feeds the model epoch after epoch (tests/test_pretraining_epochs.py)."""

import hashlib
import json
import os

from fairseq.criterions import register_criterion
from fairseq.criterions.masked_lm import MaskedLmConfig

import realformer_nmt  # noqa: F401  (registers the models, tasks, criterions, patches)
from realformer_nmt.criterions.masked_lm_acc import MaskedLmAccuracyLoss
from realformer_nmt.criterions.masked_lm_nsp import MaskedLmNspConfig, MaskedLmNspLoss


def record(sample):
    rows = {}
    src, tgt = sample["net_input"]["src_tokens"], sample["target"]
    nsp = sample.get("nsp_target")
    for row, index in enumerate(sample["id"].tolist()):
        text = f"{src[row].tolist()}|{tgt[row].tolist()}|{None if nsp is None else int(nsp[row])}"
        rows[index] = hashlib.sha1(text.encode()).hexdigest()[:16]
    with open(os.environ["EPOCH_PROBE_OUT"], "a", encoding="utf-8") as f:
        f.write(json.dumps(rows) + "\n")


@register_criterion("masked_lm_acc_probe", dataclass=MaskedLmConfig)
class MaskedLmAccuracyProbe(MaskedLmAccuracyLoss):
    def forward(self, model, sample, reduce=True):
        if model.training:
            record(sample)
        return super().forward(model, sample, reduce)


@register_criterion("masked_lm_nsp_probe", dataclass=MaskedLmNspConfig)
class MaskedLmNspProbe(MaskedLmNspLoss):
    def forward(self, model, sample, reduce=True):
        if model.training:
            record(sample)
        return super().forward(model, sample, reduce)
