"""RealFormer (He et al., 2021, "RealFormer: Transformer Likes Residual Attention") for
Hugging Face ``transformers``: the task heads over ``RealFormerModel``
(``modeling_realformer_encoder.py``, where the residual attention is).

Self-contained (torch and ``transformers`` only); written into each exported model folder
by realformer-nmt's ``scripts/export_hf.py`` so that ``AutoModel*.from_pretrained(folder,
trust_remote_code=True)`` loads it. Heads, their parameter names, inputs, outputs and
losses follow ``transformers``' BERT: masked LM, pre-training (MLM + NSP), next-sentence
prediction (class 0 = "B follows A"), sequence classification, multiple choice, token
classification and extractive question answering.
"""

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import nn
from torch.nn import BCEWithLogitsLoss, CrossEntropyLoss, MSELoss
from transformers.activations import ACT2FN
from transformers.modeling_outputs import (
    MaskedLMOutput,
    MultipleChoiceModelOutput,
    NextSentencePredictorOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from transformers.utils import ModelOutput

from .modeling_realformer_encoder import RealFormerModel, RealFormerPreTrainedModel


class RealFormerPredictionHeadTransform(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.transform_act_fn = ACT2FN[config.hidden_act]
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x):
        return self.LayerNorm(self.transform_act_fn(self.dense(x)))


class RealFormerLMPredictionHead(nn.Module):
    """Transform, decoder (tied to the word embeddings unless the config unties them) and
    an output bias per vocabulary entry."""

    def __init__(self, config):
        super().__init__()
        self.transform = RealFormerPredictionHeadTransform(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def resize_output_bias(self, rows: int, mean_resizing: bool = True):
        old = self.bias.data
        if rows == old.shape[0]:
            return
        new = old.new_full((rows,), old.mean().item() if mean_resizing else 0.0)
        keep = min(rows, old.shape[0])
        new[:keep] = old[:keep]
        self.bias = nn.Parameter(new)

    def forward(self, x):
        return self.decoder(self.transform(x)) + self.bias


class RealFormerOnlyMLMHead(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.predictions = RealFormerLMPredictionHead(config)

    def forward(self, sequence_output):
        return self.predictions(sequence_output)


class RealFormerOnlyNSPHead(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.seq_relationship = nn.Linear(config.hidden_size, 2)

    def forward(self, pooled_output):
        return self.seq_relationship(pooled_output)


class RealFormerPreTrainingHeads(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.predictions = RealFormerLMPredictionHead(config)
        self.seq_relationship = nn.Linear(config.hidden_size, 2)

    def forward(self, sequence_output, pooled_output):
        return self.predictions(sequence_output), self.seq_relationship(pooled_output)


@dataclass
class RealFormerForPreTrainingOutput(ModelOutput):
    """``prediction_logits`` ``[B, T, V]``; ``seq_relationship_logits`` ``[B, 2]`` (class 0 = is next)."""

    loss: Optional[torch.FloatTensor] = None
    prediction_logits: Optional[torch.FloatTensor] = None
    seq_relationship_logits: Optional[torch.FloatTensor] = None
    hidden_states: Optional[Tuple[torch.FloatTensor, ...]] = None
    attentions: Optional[Tuple[torch.FloatTensor, ...]] = None


_TIED = {"cls.predictions.decoder.weight": "realformer.embeddings.word_embeddings.weight"}


def _dropout(config):
    return nn.Dropout(config.classifier_dropout if config.classifier_dropout is not None
                      else config.hidden_dropout_prob)


class _Head(RealFormerPreTrainedModel):
    """The encoder call and the tuple form of the outputs, shared by the heads."""

    def _encode(self, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                output_attentions, output_hidden_states):
        return self.realformer(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                               output_attentions, output_hidden_states, return_dict=True)

    def _return(self, return_dict, output_class, loss, out, **values):
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        if not return_dict:
            rest = tuple(v for v in (out.hidden_states, out.attentions) if v is not None)
            return ((loss,) if loss is not None else ()) + tuple(values.values()) + rest
        return output_class(loss=loss, hidden_states=out.hidden_states, attentions=out.attentions, **values)


class _WithMLMHead(_Head):
    _tied_weights_keys = dict(_TIED)

    def get_output_embeddings(self):
        return self.cls.predictions.decoder

    def set_output_embeddings(self, value):
        self.cls.predictions.decoder = value


class RealFormerForPreTraining(_WithMLMHead):
    """Masked-LM and next-sentence heads (BERT's ``cls.predictions`` and ``cls.seq_relationship``)."""

    def __init__(self, config):
        super().__init__(config)
        self.realformer = RealFormerModel(config)
        self.cls = RealFormerPreTrainingHeads(config)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, labels=None, next_sentence_label=None, output_attentions=None,
                output_hidden_states=None, return_dict=None, **kwargs):
        out = self._encode(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                           output_attentions, output_hidden_states)
        mlm, nsp = self.cls(out.last_hidden_state, out.pooler_output)
        loss = None
        if labels is not None and next_sentence_label is not None:
            loss_fct = CrossEntropyLoss()
            loss = (loss_fct(mlm.view(-1, mlm.shape[-1]), labels.view(-1))
                    + loss_fct(nsp.view(-1, 2), next_sentence_label.view(-1)))
        return self._return(return_dict, RealFormerForPreTrainingOutput, loss, out, prediction_logits=mlm,
                            seq_relationship_logits=nsp)


class RealFormerForMaskedLM(_WithMLMHead):
    def __init__(self, config):
        super().__init__(config)
        self.realformer = RealFormerModel(config, add_pooling_layer=False)
        self.cls = RealFormerOnlyMLMHead(config)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, labels=None, output_attentions=None, output_hidden_states=None,
                return_dict=None, **kwargs):
        out = self._encode(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                           output_attentions, output_hidden_states)
        logits = self.cls(out.last_hidden_state)
        loss = None
        if labels is not None:
            loss = CrossEntropyLoss()(logits.view(-1, logits.shape[-1]), labels.view(-1))
        return self._return(return_dict, MaskedLMOutput, loss, out, logits=logits)


class RealFormerForNextSentencePrediction(_Head):
    """BERT's: the NSP classifier on the pooled output; class 0 = "B follows A"."""

    def __init__(self, config):
        super().__init__(config)
        self.realformer = RealFormerModel(config)
        self.cls = RealFormerOnlyNSPHead(config)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, labels=None, output_attentions=None, output_hidden_states=None,
                return_dict=None, **kwargs):
        out = self._encode(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                           output_attentions, output_hidden_states)
        logits = self.cls(out.pooler_output)
        loss = CrossEntropyLoss()(logits.view(-1, 2), labels.view(-1)) if labels is not None else None
        return self._return(return_dict, NextSentencePredictorOutput, loss, out, logits=logits)


class RealFormerForSequenceClassification(_Head):
    """BERT's: dropout and a linear classifier on the pooled output. ``num_labels == 1``:
    regression (MSE); else cross-entropy, or BCE for ``problem_type="multi_label_classification"``."""

    def __init__(self, config):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.realformer = RealFormerModel(config)
        self.dropout = _dropout(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, labels=None, output_attentions=None, output_hidden_states=None,
                return_dict=None, **kwargs):
        out = self._encode(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                           output_attentions, output_hidden_states)
        logits = self.classifier(self.dropout(out.pooler_output))
        loss = None
        if labels is not None:
            if self.config.problem_type is None:
                if self.num_labels == 1:
                    self.config.problem_type = "regression"
                elif labels.dtype in (torch.long, torch.int):
                    self.config.problem_type = "single_label_classification"
                else:
                    self.config.problem_type = "multi_label_classification"
            if self.config.problem_type == "regression":
                loss = MSELoss()(logits.squeeze(-1), labels.squeeze(-1).to(logits.dtype))
            elif self.config.problem_type == "single_label_classification":
                loss = CrossEntropyLoss()(logits.view(-1, self.num_labels), labels.view(-1))
            else:
                loss = BCEWithLogitsLoss()(logits, labels.to(logits.dtype))
        return self._return(return_dict, SequenceClassifierOutput, loss, out, logits=logits)


class RealFormerForMultipleChoice(_Head):
    """BERT's: inputs ``[B, C, T]``; one score per choice from the pooled output, ``logits`` ``[B, C]``."""

    def __init__(self, config):
        super().__init__(config)
        self.realformer = RealFormerModel(config)
        self.dropout = _dropout(config)
        self.classifier = nn.Linear(config.hidden_size, 1)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, labels=None, output_attentions=None, output_hidden_states=None,
                return_dict=None, **kwargs):
        choices = (input_ids if input_ids is not None else inputs_embeds).shape[1]

        def flat(t):
            return t.reshape((-1,) + t.shape[2:]) if t is not None else None

        out = self._encode(flat(input_ids), flat(attention_mask), flat(token_type_ids), flat(position_ids),
                           flat(inputs_embeds), output_attentions, output_hidden_states)
        logits = self.classifier(self.dropout(out.pooler_output)).view(-1, choices)
        loss = CrossEntropyLoss()(logits, labels) if labels is not None else None
        return self._return(return_dict, MultipleChoiceModelOutput, loss, out, logits=logits)


class RealFormerForTokenClassification(_Head):
    """BERT's: dropout and a linear classifier on every position; labels -100 are ignored."""

    def __init__(self, config):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.realformer = RealFormerModel(config, add_pooling_layer=False)
        self.dropout = _dropout(config)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, labels=None, output_attentions=None, output_hidden_states=None,
                return_dict=None, **kwargs):
        out = self._encode(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                           output_attentions, output_hidden_states)
        logits = self.classifier(self.dropout(out.last_hidden_state))
        loss = None
        if labels is not None:
            loss = CrossEntropyLoss()(logits.view(-1, self.num_labels), labels.view(-1))
        return self._return(return_dict, TokenClassifierOutput, loss, out, logits=logits)


class RealFormerForQuestionAnswering(_Head):
    """BERT's extractive QA: start and end logits per position; positions outside the input are ignored."""

    def __init__(self, config):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.realformer = RealFormerModel(config, add_pooling_layer=False)
        self.qa_outputs = nn.Linear(config.hidden_size, 2)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, start_positions=None, end_positions=None, output_attentions=None,
                output_hidden_states=None, return_dict=None, **kwargs):
        out = self._encode(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                           output_attentions, output_hidden_states)
        start, end = (t.squeeze(-1).contiguous() for t in self.qa_outputs(out.last_hidden_state).split(1, dim=-1))
        loss = None
        if start_positions is not None and end_positions is not None:
            ignored = start.shape[1]
            loss_fct = CrossEntropyLoss(ignore_index=ignored)
            loss = (loss_fct(start, start_positions.view(-1).clamp(0, ignored))
                    + loss_fct(end, end_positions.view(-1).clamp(0, ignored))) / 2
        return self._return(return_dict, QuestionAnsweringModelOutput, loss, out, start_logits=start,
                            end_logits=end)


__all__ = [
    "RealFormerPreTrainedModel",
    "RealFormerModel",
    "RealFormerForMaskedLM",
    "RealFormerForPreTraining",
    "RealFormerForNextSentencePrediction",
    "RealFormerForSequenceClassification",
    "RealFormerForMultipleChoice",
    "RealFormerForTokenClassification",
    "RealFormerForQuestionAnswering",
]
