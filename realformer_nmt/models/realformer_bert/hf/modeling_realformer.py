"""RealFormer (He et al., 2021, "RealFormer: Transformer Likes Residual Attention") for
Hugging Face ``transformers``: BERT with residual attention.

Self-contained (torch and ``transformers`` only); written into each exported model folder
by realformer-nmt's ``scripts/export_hf.py`` so that ``AutoModel*.from_pretrained(folder,
trust_remote_code=True)`` loads it. Module and parameter names, inputs, outputs and heads
follow ``transformers``' BERT (``modeling_bert.py``). The one change is in attention: layer
n adds its raw scores to the running sum handed over by layer n-1 and attends with the
softmax of that sum (``mode="sum"``) or of the sum divided by n (``mode="mean"``)::

    A_n = Q_n K_n^T / sqrt(d) + A_{n-1};   P_n = softmax(mask(A_n / c_n)) V_n

The *unmasked* sum goes on to the next layer (google-research ``realformer.py``). Scores,
their running sum and the softmax are computed in float32 whatever the model's dtype.
Next-sentence logits follow BERT's convention: class 0 = "B follows A".
"""

from dataclasses import dataclass
from typing import Optional, Tuple

import torch
from torch import nn
from torch.nn import BCEWithLogitsLoss, CrossEntropyLoss, MSELoss
from transformers import PreTrainedModel
from transformers.activations import ACT2FN
from transformers.modeling_outputs import (
    BaseModelOutputWithPooling,
    MaskedLMOutput,
    SequenceClassifierOutput,
)
from transformers.utils import ModelOutput

try:  # transformers >= 5: initializers that leave loaded weights alone
    from transformers import initialization as init
except ImportError:  # pragma: no cover
    from torch.nn import init

from .configuration_realformer import RealFormerConfig


class RealFormerEmbeddings(nn.Module):
    """Word + (token type) + position embeddings, layer norm, dropout (BERT's), with the
    fairseq/RoBERTa position rule and padding zeroing when the config asks for them."""

    def __init__(self, config: RealFormerConfig):
        super().__init__()
        self.config = config
        self.padding_idx = config.pad_token_id
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size, padding_idx=config.pad_token_id)
        fairseq_positions = config.position_offset is None
        self.position_embeddings = nn.Embedding(
            config.max_position_embeddings, config.hidden_size,
            padding_idx=config.pad_token_id if fairseq_positions else None,
        )
        self.token_type_embeddings = (
            nn.Embedding(config.type_vocab_size, config.hidden_size) if config.type_vocab_size > 0 else None
        )
        self.LayerNorm = (
            nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) if config.embedding_layer_norm else None
        )
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def position_ids(self, input_ids, length, device):
        if self.config.position_offset is not None:
            start = self.config.position_offset
            return torch.arange(start, start + length, device=device).unsqueeze(0)
        if input_ids is None:  # inputs_embeds: every position is a real token
            return torch.arange(self.padding_idx + 1, self.padding_idx + 1 + length, device=device).unsqueeze(0)
        keep = input_ids.ne(self.padding_idx).long()
        return torch.cumsum(keep, dim=1) * keep + self.padding_idx  # fairseq's make_positions

    def forward(self, input_ids=None, token_type_ids=None, position_ids=None, inputs_embeds=None, attention_mask=None):
        if inputs_embeds is None:
            inputs_embeds = self.word_embeddings(input_ids)
        batch, length = inputs_embeds.shape[:2]
        x = inputs_embeds * self.config.embed_scale if self.config.embed_scale != 1.0 else inputs_embeds
        if self.token_type_embeddings is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros((batch, length), dtype=torch.long, device=x.device)
            x = x + self.token_type_embeddings(token_type_ids)
        if position_ids is None:
            position_ids = self.position_ids(input_ids, length, x.device)
        x = x + self.position_embeddings(position_ids)
        if self.LayerNorm is not None:
            x = self.LayerNorm(x)
        x = self.dropout(x)
        if self.config.zero_padding_embeddings and attention_mask is not None:
            x = x * attention_mask.unsqueeze(-1).to(x.dtype)
        return x


class RealFormerSelfAttention(nn.Module):
    """BERT's self-attention with the residual scores: returns ``(context, probs, scores)``,
    ``scores`` the running sum ``A_n`` (float32, unmasked) for the next layer."""

    def __init__(self, config: RealFormerConfig, layer_index: int):
        super().__init__()
        self.num_attention_heads = config.num_attention_heads
        self.attention_head_size = config.hidden_size // config.num_attention_heads
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)
        self.residual = config.residual_attention
        # mean: divide the sum of n layers' scores by n (layer_index + 1)
        self.divisor = float(layer_index + 1) if config.residual_attention_mode == "mean" and self.residual else 1.0

    def _heads(self, x):
        batch, length, _ = x.shape
        return x.view(batch, length, self.num_attention_heads, self.attention_head_size).transpose(1, 2)

    def forward(self, hidden_states, attention_mask=None, prev_scores=None):
        q = self._heads(self.query(hidden_states)) * self.attention_head_size ** -0.5
        k = self._heads(self.key(hidden_states))
        v = self._heads(self.value(hidden_states))
        scores = torch.matmul(q, k.transpose(-1, -2)).float()  # [B, H, T, S]
        if self.residual and prev_scores is not None:
            scores = scores + prev_scores
        logits = scores / self.divisor if self.divisor != 1.0 else scores
        if attention_mask is not None:  # [B, S], 1 = attend
            padded = attention_mask.eq(0)[:, None, None, :]
            logits = logits.masked_fill(padded, torch.finfo(logits.dtype).min)
        probs = torch.softmax(logits, dim=-1)
        context = torch.matmul(self.dropout(probs).to(v.dtype), v)
        batch, _, length, _ = context.shape
        context = context.transpose(1, 2).reshape(batch, length, -1)
        return context, probs, scores if self.residual else None


class RealFormerSelfOutput(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)


class RealFormerAttention(nn.Module):
    def __init__(self, config, layer_index):
        super().__init__()
        self.self = RealFormerSelfAttention(config, layer_index)
        self.output = RealFormerSelfOutput(config)


class RealFormerIntermediate(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.intermediate_size)
        self.intermediate_act_fn = ACT2FN[config.hidden_act]


class RealFormerOutput(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.intermediate_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)


class RealFormerLayer(nn.Module):
    """BERT's layer (Post-LN; Pre-LN with ``normalize_before``)."""

    def __init__(self, config, layer_index):
        super().__init__()
        self.pre_ln = config.normalize_before
        self.attention = RealFormerAttention(config, layer_index)
        self.intermediate = RealFormerIntermediate(config)
        self.output = RealFormerOutput(config)

    def forward(self, x, attention_mask=None, prev_scores=None):
        attn_out = self.attention.output
        h = attn_out.LayerNorm(x) if self.pre_ln else x
        context, probs, scores = self.attention.self(h, attention_mask, prev_scores)
        x = attn_out.dropout(attn_out.dense(context)) + x
        if not self.pre_ln:
            x = attn_out.LayerNorm(x)
        out = self.output
        h = out.LayerNorm(x) if self.pre_ln else x
        h = self.intermediate.intermediate_act_fn(self.intermediate.dense(h))
        x = out.dropout(out.dense(h)) + x
        if not self.pre_ln:
            x = out.LayerNorm(x)
        return x, probs, scores


class RealFormerEncoder(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.layer = nn.ModuleList([RealFormerLayer(config, i) for i in range(config.num_hidden_layers)])
        self.final_layer_norm = (
            nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) if config.normalize_before else None
        )

    def forward(self, x, attention_mask=None, output_attentions=False, output_hidden_states=False):
        hidden_states = (x,) if output_hidden_states else None
        attentions = () if output_attentions else None
        scores = None
        for layer in self.layer:
            x, probs, scores = layer(x, attention_mask, scores)
            if output_hidden_states:
                hidden_states = hidden_states + (x,)
            if output_attentions:
                attentions = attentions + (probs.to(x.dtype),)
        if self.final_layer_norm is not None:
            x = self.final_layer_norm(x)
        return x, hidden_states, attentions


class RealFormerPooler(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.activation = ACT2FN[config.pooler_act]

    def forward(self, hidden_states):
        return self.activation(self.dense(hidden_states[:, 0]))


class RealFormerPredictionHeadTransform(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.transform_act_fn = ACT2FN[config.hidden_act]
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, x):
        return self.LayerNorm(self.transform_act_fn(self.dense(x)))


class RealFormerLMPredictionHead(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.transform = RealFormerPredictionHeadTransform(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))

    def forward(self, x):
        return self.decoder(self.transform(x)) + self.bias


class RealFormerOnlyMLMHead(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.predictions = RealFormerLMPredictionHead(config)

    def forward(self, sequence_output):
        return self.predictions(sequence_output)


class RealFormerPreTrainingHeads(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.predictions = RealFormerLMPredictionHead(config)
        self.seq_relationship = nn.Linear(config.hidden_size, 2)

    def forward(self, sequence_output, pooled_output):
        return self.predictions(sequence_output), self.seq_relationship(pooled_output)


class RealFormerPreTrainedModel(PreTrainedModel):
    config_class = RealFormerConfig
    base_model_prefix = "realformer"
    supports_gradient_checkpointing = False

    def _init_weights(self, module):
        """BERT's: normal(0, initializer_range) weights, zero biases, unit LayerNorms."""
        super()._init_weights(module)
        if isinstance(module, RealFormerLMPredictionHead):
            init.zeros_(module.bias)


@dataclass
class RealFormerForPreTrainingOutput(ModelOutput):
    """``prediction_logits`` ``[B, T, V]``; ``seq_relationship_logits`` ``[B, 2]`` (class 0 = is next)."""

    loss: Optional[torch.FloatTensor] = None
    prediction_logits: Optional[torch.FloatTensor] = None
    seq_relationship_logits: Optional[torch.FloatTensor] = None
    hidden_states: Optional[Tuple[torch.FloatTensor, ...]] = None
    attentions: Optional[Tuple[torch.FloatTensor, ...]] = None


class RealFormerModel(RealFormerPreTrainedModel):
    """The encoder: ``last_hidden_state`` and ``pooler_output`` (BERT's pooler on the first
    token); ``attentions`` are each layer's probabilities ``softmax(mask(A_n / c_n))``."""

    def __init__(self, config, add_pooling_layer=True):
        super().__init__(config)
        self.embeddings = RealFormerEmbeddings(config)
        self.encoder = RealFormerEncoder(config)
        self.pooler = RealFormerPooler(config) if add_pooling_layer else None
        self.post_init()

    def get_input_embeddings(self):
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value):
        self.embeddings.word_embeddings = value

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, output_attentions=None, output_hidden_states=None, return_dict=None, **kwargs):
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError("give exactly one of input_ids and inputs_embeds")
        output_attentions = output_attentions if output_attentions is not None else self.config.output_attentions
        output_hidden_states = (output_hidden_states if output_hidden_states is not None
                                else self.config.output_hidden_states)
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        x = self.embeddings(input_ids, token_type_ids, position_ids, inputs_embeds, attention_mask)
        x, hidden_states, attentions = self.encoder(x, attention_mask, output_attentions, output_hidden_states)
        pooled = self.pooler(x) if self.pooler is not None else None
        if not return_dict:
            return tuple(v for v in (x, pooled, hidden_states, attentions) if v is not None)
        return BaseModelOutputWithPooling(last_hidden_state=x, pooler_output=pooled,
                                          hidden_states=hidden_states, attentions=attentions)


_TIED = {"cls.predictions.decoder.weight": "realformer.embeddings.word_embeddings.weight"}


class RealFormerForPreTraining(RealFormerPreTrainedModel):
    """Masked-LM and next-sentence heads (BERT's ``cls.predictions`` and ``cls.seq_relationship``)."""

    _tied_weights_keys = dict(_TIED)

    def __init__(self, config):
        super().__init__(config)
        self.realformer = RealFormerModel(config)
        self.cls = RealFormerPreTrainingHeads(config)
        self.post_init()

    def get_output_embeddings(self):
        return self.cls.predictions.decoder

    def set_output_embeddings(self, value):
        self.cls.predictions.decoder = value

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, labels=None, next_sentence_label=None, output_attentions=None,
                output_hidden_states=None, return_dict=None, **kwargs):
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        out = self.realformer(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                              output_attentions, output_hidden_states, return_dict=True)
        mlm, nsp = self.cls(out.last_hidden_state, out.pooler_output)
        loss = None
        if labels is not None and next_sentence_label is not None:
            loss_fct = CrossEntropyLoss()
            loss = (loss_fct(mlm.view(-1, self.config.vocab_size), labels.view(-1))
                    + loss_fct(nsp.view(-1, 2), next_sentence_label.view(-1)))
        if not return_dict:
            rest = tuple(v for v in (out.hidden_states, out.attentions) if v is not None)
            return ((loss,) if loss is not None else ()) + (mlm, nsp) + rest
        return RealFormerForPreTrainingOutput(loss=loss, prediction_logits=mlm, seq_relationship_logits=nsp,
                                              hidden_states=out.hidden_states, attentions=out.attentions)


class RealFormerForMaskedLM(RealFormerPreTrainedModel):
    _tied_weights_keys = dict(_TIED)

    def __init__(self, config):
        super().__init__(config)
        self.realformer = RealFormerModel(config, add_pooling_layer=False)
        self.cls = RealFormerOnlyMLMHead(config)
        self.post_init()

    def get_output_embeddings(self):
        return self.cls.predictions.decoder

    def set_output_embeddings(self, value):
        self.cls.predictions.decoder = value

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, labels=None, output_attentions=None, output_hidden_states=None,
                return_dict=None, **kwargs):
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        out = self.realformer(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                              output_attentions, output_hidden_states, return_dict=True)
        logits = self.cls(out.last_hidden_state)
        loss = None
        if labels is not None:
            loss = CrossEntropyLoss()(logits.view(-1, self.config.vocab_size), labels.view(-1))
        if not return_dict:
            rest = tuple(v for v in (out.hidden_states, out.attentions) if v is not None)
            return ((loss,) if loss is not None else ()) + (logits,) + rest
        return MaskedLMOutput(loss=loss, logits=logits, hidden_states=out.hidden_states, attentions=out.attentions)


class RealFormerForSequenceClassification(RealFormerPreTrainedModel):
    """BERT's: dropout and a linear classifier on the pooled output. ``num_labels == 1``:
    regression (MSE); else cross-entropy, or BCE for ``problem_type="multi_label_classification"``."""

    def __init__(self, config):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.realformer = RealFormerModel(config)
        dropout = config.classifier_dropout if config.classifier_dropout is not None else config.hidden_dropout_prob
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    def forward(self, input_ids=None, attention_mask=None, token_type_ids=None, position_ids=None,
                inputs_embeds=None, labels=None, output_attentions=None, output_hidden_states=None,
                return_dict=None, **kwargs):
        return_dict = return_dict if return_dict is not None else self.config.return_dict
        out = self.realformer(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                              output_attentions, output_hidden_states, return_dict=True)
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
        if not return_dict:
            rest = tuple(v for v in (out.hidden_states, out.attentions) if v is not None)
            return ((loss,) if loss is not None else ()) + (logits,) + rest
        return SequenceClassifierOutput(loss=loss, logits=logits, hidden_states=out.hidden_states,
                                        attentions=out.attentions)


__all__ = [
    "RealFormerPreTrainedModel",
    "RealFormerModel",
    "RealFormerForMaskedLM",
    "RealFormerForPreTraining",
    "RealFormerForSequenceClassification",
]
