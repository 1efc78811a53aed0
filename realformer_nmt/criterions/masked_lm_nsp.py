"""``--criterion masked_lm_nsp``: MLM cross-entropy (mean over masked tokens) + ``--nsp-loss-weight``
x NSP cross-entropy (mean over pairs), as in BERT; logs both losses and accuracies (docs/internals.md#bert).
"""

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from fairseq import modules, utils
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import FairseqDataclass
from fairseq.logging import metrics

from ..errors import ConfigError
from ..tasks.masked_lm_nsp import NSP_HEAD
from .masked_lm_acc import count_correct, log_accuracy


@dataclass
class MaskedLmNspConfig(FairseqDataclass):
    nsp_loss_weight: float = field(default=1.0, metadata={"help": "weight of the next-sentence loss"})


@register_criterion("masked_lm_nsp", dataclass=MaskedLmNspConfig)
class MaskedLmNspLoss(FairseqCriterion):
    """Masked LM + next-sentence prediction (use with ``--task masked_lm_nsp``)."""

    def __init__(self, cfg: MaskedLmNspConfig, task):
        super().__init__(task)
        self.nsp_loss_weight = cfg.nsp_loss_weight
        self.head = getattr(task, "nsp_head", NSP_HEAD)

    def forward(self, model, sample, reduce=True):
        if "nsp_target" not in sample:
            raise ConfigError("--criterion masked_lm_nsp needs --task masked_lm_nsp (batches without "
                              "next-sentence labels)")
        target = sample["target"]
        masked = target.ne(self.padding_idx)
        n_masked = masked.sum()
        # as fairseq's masked_lm: project only masked positions; all of them if none is
        # masked (without a device-to-host sync on accelerators)
        if masked.device == torch.device("cpu"):
            masked_tokens = masked if masked.any() else None
        else:
            masked_tokens = torch.where(masked.any(), masked, masked.new([True]))

        features, _ = model(**sample["net_input"], features_only=True)
        lm_logits = model.encoder.output_layer(features, masked_tokens=masked_tokens)
        lm_targets = target[masked_tokens] if masked_tokens is not None else target
        mlm_loss = modules.cross_entropy(lm_logits.view(-1, lm_logits.size(-1)), lm_targets.view(-1), reduction="sum",
                                         ignore_index=self.padding_idx)
        nsp_logits = model.classification_heads[self.head](features)
        nsp_target = sample["nsp_target"].view(-1)
        nsp_loss = F.cross_entropy(nsp_logits.float(), nsp_target, reduction="sum")
        nsentences = nsp_target.numel()

        loss = mlm_loss / n_masked.clamp(min=1) + self.nsp_loss_weight * nsp_loss / nsentences
        mlm_correct, mlm_total = count_correct(lm_logits.detach(), lm_targets, self.padding_idx)
        logging_output = {
            "loss": loss.data, "mlm_loss": mlm_loss.data, "nsp_loss": nsp_loss.data, "mlm_correct": mlm_correct,
            "mlm_total": mlm_total, "nsp_correct": (nsp_logits.detach().argmax(dim=-1) == nsp_target).sum(),
            "ntokens": sample["ntokens"], "nsentences": nsentences, "sample_size": 1,
        }
        return loss, 1, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        def total(key):
            return utils.item(sum(log.get(key, 0) for log in logging_outputs))

        batches, n_masked, nsentences = total("sample_size"), total("mlm_total"), total("nsentences")
        metrics.log_scalar("loss", total("loss") / max(batches, 1) / math.log(2), batches, round=3)
        if n_masked > 0:
            metrics.log_scalar("mlm_loss", total("mlm_loss") / n_masked / math.log(2), n_masked, round=3)
        if nsentences > 0:
            metrics.log_scalar("nsp_loss", total("nsp_loss") / nsentences / math.log(2), nsentences, round=3)
        log_accuracy(logging_outputs, "mlm_accuracy", "mlm_correct", "mlm_total")
        log_accuracy(logging_outputs, "nsp_accuracy", "nsp_correct", "nsentences")

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
