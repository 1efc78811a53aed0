"""RealFormer (He et al., 2021, "RealFormer: Transformer Likes Residual Attention") for
Hugging Face ``transformers``: the encoder (embeddings, residual attention, layers,
pooler) and ``RealFormerModel``; the task heads are in ``modeling_realformer.py``.

Self-contained (torch and ``transformers`` only); written into each exported model folder
by realformer-nmt's ``scripts/export_hf.py``. Module and parameter names, inputs and
outputs follow ``transformers``' BERT (``modeling_bert.py``). The one change is in
attention: layer n adds its raw scores to the running sum handed over by layer n-1 and
attends with the softmax of that sum (``mode="sum"``) or of the sum divided by n
(``mode="mean"``)::

    A_n = Q_n K_n^T / sqrt(d) + A_{n-1};   P_n = softmax(mask(A_n / c_n)) V_n

The *unmasked* sum goes on to the next layer (google-research ``realformer.py``). The
running sum is float32 whatever the model's dtype. Two kernels compute the same function
(``attn_implementation``): ``"eager"`` forms the softmax explicitly (scores and softmax in
float32); ``"sdpa"`` calls ``torch.nn.functional.scaled_dot_product_attention`` with
``A_{n-1} / c_n`` plus the padding mask as its float mask (in the model's dtype), and forms
``A_n`` only where a next layer reads it. ``output_attentions=True`` uses eager.
"""

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.activations import ACT2FN
from transformers.modeling_outputs import BaseModelOutputWithPooling

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

    def max_length(self) -> int:
        """The longest input, in tokens, that the position table holds."""
        first = self.config.position_offset if self.config.position_offset is not None else self.padding_idx + 1
        return self.config.max_position_embeddings - first

    def position_ids(self, input_ids, length, device):
        if self.config.position_offset is not None:
            start = self.config.position_offset
            return torch.arange(start, start + length, device=device).unsqueeze(0)
        if input_ids is None:  # inputs_embeds: every position is a real token
            return torch.arange(self.padding_idx + 1, self.padding_idx + 1 + length, device=device).unsqueeze(0)
        keep = input_ids.ne(self.padding_idx).long()
        return torch.cumsum(keep, dim=1) * keep + self.padding_idx  # fairseq's make_positions

    def forward(self, input_ids=None, token_type_ids=None, position_ids=None, inputs_embeds=None, attention_mask=None):
        length = (input_ids if input_ids is not None else inputs_embeds).shape[1]
        if length > self.max_length() and position_ids is None:
            raise ValueError(f"an input of {length} tokens is longer than this model's {self.max_length()} positions "
                             f"(max_position_embeddings {self.config.max_position_embeddings}): truncate it, "
                             f"e.g. tokenizer(..., truncation=True, max_length={self.max_length()})")
        if self.token_type_embeddings is None and token_type_ids is not None and bool(token_type_ids.ne(0).any()):
            raise ValueError("token_type_ids: this model has no token type (segment) embeddings "
                             "(type_vocab_size 0); leave them out (sentence pairs are told apart by </s> </s>)")
        if inputs_embeds is None:
            inputs_embeds = self.word_embeddings(input_ids)
        batch = inputs_embeds.shape[0]
        x = inputs_embeds * self.config.embed_scale if self.config.embed_scale != 1.0 else inputs_embeds
        if self.token_type_embeddings is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros((batch, length), dtype=torch.long, device=x.device)
            x = x + self.token_type_embeddings(token_type_ids)
        if position_ids is None:
            position_ids = self.position_ids(input_ids, length, x.device)
        elif int(position_ids.max()) >= self.config.max_position_embeddings:
            raise ValueError(f"position_ids reach {int(position_ids.max())}; this model has "
                             f"{self.config.max_position_embeddings} positions (max_position_embeddings)")
        x = x + self.position_embeddings(position_ids)
        if self.LayerNorm is not None:
            x = self.LayerNorm(x)
        x = self.dropout(x)
        if self.config.zero_padding_embeddings and attention_mask is not None:
            x = x * attention_mask.unsqueeze(-1).to(x.dtype)
        return x


class RealFormerSelfAttention(nn.Module):
    """BERT's self-attention with the residual scores: returns ``(context, probs, scores)``,
    ``scores`` the running sum ``A_n`` (float32, unmasked) for the next layer (None when
    no layer reads it), ``probs`` None under the sdpa kernel."""

    def __init__(self, config: RealFormerConfig, layer_index: int):
        super().__init__()
        self.config = config
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

    def forward(self, hidden_states, attention_mask=None, prev_scores=None, need_scores=True, eager=False):
        scale = self.attention_head_size ** -0.5
        q = self._heads(self.query(hidden_states))
        k = self._heads(self.key(hidden_states))
        v = self._heads(self.value(hidden_states))
        prev = prev_scores if self.residual else None
        padded = attention_mask.eq(0)[:, None, None, :] if attention_mask is not None else None  # [B, 1, 1, S]
        probs = scores = None
        if eager or getattr(self.config, "_attn_implementation", "eager") != "sdpa":
            scores = torch.matmul(q * scale, k.transpose(-1, -2)).float()  # [B, H, T, S]
            if prev is not None:
                scores = scores + prev
            logits = scores / self.divisor if self.divisor != 1.0 else scores
            if padded is not None:
                logits = logits.masked_fill(padded, torch.finfo(logits.dtype).min)
            probs = torch.softmax(logits, dim=-1)
            context = torch.matmul(self.dropout(probs).to(v.dtype), v)
        else:
            bias = None
            if prev is not None:
                bias = (prev / self.divisor).to(q.dtype)
            if padded is not None:
                bias = (bias if bias is not None else q.new_zeros(())).masked_fill(padded, torch.finfo(q.dtype).min)
            context = F.scaled_dot_product_attention(
                q, k, v, attn_mask=bias, dropout_p=self.dropout.p if self.training else 0.0,
                scale=scale / self.divisor)
            if self.residual and need_scores:
                scores = torch.matmul(q * scale, k.transpose(-1, -2)).float()
                if prev is not None:
                    scores = scores + prev
        batch, _, length, _ = context.shape
        # [B, H, T, D] -> [B, T, H * D] through an explicit copy, never a view: SDPA's output
        # layout depends on the kernel (CPU flash: [B, T, H, D] in memory, math: [B, H, T, D]),
        # and torch.export records reshape()/contiguous() as the layout it traced with, so
        # the ONNX exporter's (dynamo's) rerun on another kernel failed "Cannot view a tensor"
        context = context.transpose(1, 2).clone(memory_format=torch.contiguous_format).view(batch, length, -1)
        return context, probs, scores if self.residual and need_scores else None


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

    def forward(self, x, attention_mask=None, prev_scores=None, need_scores=True, eager=False):
        attn_out = self.attention.output
        h = attn_out.LayerNorm(x) if self.pre_ln else x
        context, probs, scores = self.attention.self(h, attention_mask, prev_scores, need_scores, eager)
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
    """The layer loop: the running sum ``scores`` goes from layer n to layer n+1.
    ``gradient_checkpointing`` (``model.gradient_checkpointing_enable()``): each layer is
    recomputed in the backward pass instead of keeping its activations."""

    def __init__(self, config):
        super().__init__()
        self.layer = nn.ModuleList([RealFormerLayer(config, i) for i in range(config.num_hidden_layers)])
        self.final_layer_norm = (
            nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps) if config.normalize_before else None
        )
        self.gradient_checkpointing = False

    def forward(self, x, attention_mask=None, output_attentions=False, output_hidden_states=False):
        hidden_states = (x,) if output_hidden_states else None
        attentions = () if output_attentions else None
        scores = None
        last = len(self.layer) - 1
        checkpoint = self.gradient_checkpointing and self.training and torch.is_grad_enabled()
        for i, layer in enumerate(self.layer):
            args = (x, attention_mask, scores, i < last, bool(output_attentions))
            if checkpoint:
                x, probs, scores = self._gradient_checkpointing_func(layer.__call__, *args)
            else:
                x, probs, scores = layer(*args)
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


class RealFormerPreTrainedModel(PreTrainedModel):
    config_class = RealFormerConfig
    base_model_prefix = "realformer"
    supports_gradient_checkpointing = True
    _supports_sdpa = True  # and eager; no flash or flex kernel takes the residual scores

    @classmethod
    def _can_set_attn_implementation(cls) -> bool:
        """``model.set_attn_implementation("eager" | "sdpa")`` switches a loaded model:
        the attention reads ``config._attn_implementation`` at every forward, as BERT's
        does. (``transformers`` guesses this from the source, looking for
        ``ALL_ATTENTION_FUNCTIONS``, which the residual attention does not use.)"""
        return True

    def _init_weights(self, module):
        """BERT's: normal(0, initializer_range) weights, zero biases, unit LayerNorms;
        output biases (``module.bias`` of the masked-LM head) zero."""
        super()._init_weights(module)
        if hasattr(module, "resize_output_bias"):
            init.zeros_(module.bias)

    def resize_token_embeddings(self, new_num_tokens: Optional[int] = None, pad_to_multiple_of: Optional[int] = None,
                                mean_resizing: bool = True) -> nn.Embedding:
        """``PreTrainedModel``'s, plus the masked-LM head's output bias (new rows: the
        mean of the old ones with ``mean_resizing``, else zero)."""
        embeddings = super().resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        for module in self.modules():
            if hasattr(module, "resize_output_bias"):
                module.resize_output_bias(embeddings.weight.shape[0], mean_resizing)
        return embeddings


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
