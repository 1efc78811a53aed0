"""``--criterion masked_lm_acc``: fairseq's ``masked_lm`` loss, unchanged, plus ``mlm_accuracy`` (%)."""

from fairseq import utils
from fairseq.criterions import register_criterion
from fairseq.criterions.masked_lm import MaskedLmConfig, MaskedLmLoss
from fairseq.logging import metrics


def count_correct(logits, target, padding_idx):
    """``(n_correct, n_predicted)`` for MLM ``logits`` (``[n_masked, V]``, ``[B, T, V]`` or
    ``[B * T, V]``, as fairseq projects them) against ``target`` (pad = not masked)."""
    masked = target.ne(padding_idx)
    if logits.dim() == target.dim() + 1:
        logits = logits[masked]
    elif target.dim() > 1 and logits.size(0) == target.numel():
        logits = logits[masked.reshape(-1)]  # every position projected, flattened
    targets = target[masked]
    return (logits.argmax(dim=-1) == targets).sum(), targets.numel()


def log_accuracy(logging_outputs, name, correct_key, total_key):
    """Sum ``correct_key``/``total_key`` over the outputs and log ``name`` in percent."""
    correct = utils.item(sum(log.get(correct_key, 0) for log in logging_outputs))
    total = utils.item(sum(log.get(total_key, 0) for log in logging_outputs))
    if total == 0:
        return
    metrics.log_scalar_sum(f"_{name}_correct", correct)
    metrics.log_scalar_sum(f"_{name}_total", total)
    metrics.log_derived(
        name,
        lambda meters: round(100.0 * meters[f"_{name}_correct"].sum / meters[f"_{name}_total"].sum, 3)
        if meters[f"_{name}_total"].sum > 0 else float("nan"),
    )


class _LogitsRecorder:
    """Calls the model as usual and keeps its first output (the MLM logits)."""

    def __init__(self, model):
        self._model = model
        self.logits = None

    def __call__(self, *args, **kwargs):
        output = self._model(*args, **kwargs)
        self.logits = output[0]
        return output

    def __getattr__(self, name):
        return getattr(self._model, name)


@register_criterion("masked_lm_acc", dataclass=MaskedLmConfig)
class MaskedLmAccuracyLoss(MaskedLmLoss):
    """fairseq's masked LM loss; also logs ``mlm_accuracy`` (%)."""

    def forward(self, model, sample, reduce=True):
        recorder = _LogitsRecorder(model)
        loss, sample_size, logging_output = super().forward(recorder, sample, reduce=reduce)
        correct, total = count_correct(recorder.logits.detach(), sample["target"], self.padding_idx)
        logging_output["mlm_correct"] = correct  # a tensor: no device sync per step
        logging_output["mlm_total"] = total
        return loss, sample_size, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        MaskedLmLoss.reduce_metrics(logging_outputs)
        log_accuracy(logging_outputs, "mlm_accuracy", "mlm_correct", "mlm_total")
