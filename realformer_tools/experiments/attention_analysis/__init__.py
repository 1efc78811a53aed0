"""Attention analysis in the style of the paper's Figs 4-8: per (layer, head), the
distribution over real query tokens of the attention entropy, and of the Jensen-Shannon
divergence between head i of layer L and head i of layer L-1.

The probabilities are the model's own: forward hooks on every attention module
(fairseq's ``MultiheadAttention`` and its subclass ``ResidualMultiheadAttention``) ask
the module for per-head weights and read them from its return value, so whatever the
module computes in training (residual sum or mean, masks, kernel choice, falling back
to the materialized path when weights are requested) is what is measured. Nothing here
recomputes attention.

Shapes: ``[B, H, T, S]`` = batch, heads, queries, keys. All logarithms are natural:
entropy lies in ``[0, ln S]``, JSD in ``[0, ln 2]``.

Control (``own_scores``): a RealFormer layer n > 1 attends with the softmax of the running
sum ``A_n = A_{n-1} + S_n`` (``S_n = Q_n K_n^T / sqrt(d)``), so its attention contains the
layers below by construction, and adjacent layers look alike (and sums of logits look
sharper) whatever was learned. Beside the attention each layer uses, the same statistics
are computed on the layer's own scores, ``softmax(mask(S_n))`` with the layer's masks
(``ResidualMultiheadAttention.need_own_weights``). For fairseq's own module (Post-LN,
Pre-LN, a path set to ``none``) and RealFormer's first layer of a path, own scores are the
attention used; ``max_abs_difference_from_used`` records per layer how far they differ.

Statistics are streamed into fixed-width histograms (``BIN_WIDTH`` nats), so memory
does not grow with the number of sentences; medians and quartiles read from them are
within one bin width of the exact ones (exact min and max are kept too).

Where each part lives (one concept per module):

* ``estimators``: entropy, JSD, the per-token stream of one batch (``LayerStream``,
  ``token_statistics``);
* ``histograms``: the streamed histograms and quantiles (``Histogram``) and one attention
  type's statistics (``TypeStats``);
* ``recording``: the hooks that read the model's probabilities (``recording_attention``,
  ``attention_probabilities``), a batch's inputs and masks;
* ``analysis``: one checkpoint over a split, resumable (``Analysis``, ``analyze_checkpoint``);
* ``plots``: the violin figures; ``report``: the per-layer summary, its markdown, the JSON;
* ``command``: ``analyze_and_report``, what ``scripts/analyze_attention.py`` runs.
"""

from .analysis import Analysis, analyze_checkpoint, describe_model, load_checkpoint
from .command import analyze_and_report
from .estimators import BIN_WIDTH, QUARTILES, STATISTICS, LayerStream, entropy, js_divergence, token_statistics
from .histograms import Histogram, TypeStats
from .plots import plot_violins
from .recording import (
    ATTENTION_TYPES,
    attention_modules,
    attention_probabilities,
    forward,
    model_inputs,
    recording_attention,
    restore_masked_tokens,
)
from .report import SUMMARY_KEYS, layer_summary, summary_markdown, write_json

__all__ = ["ATTENTION_TYPES", "BIN_WIDTH", "QUARTILES", "STATISTICS", "SUMMARY_KEYS", "Analysis", "Histogram",
           "LayerStream", "TypeStats", "analyze_and_report", "analyze_checkpoint", "attention_modules",
           "attention_probabilities", "describe_model", "entropy", "forward", "js_divergence", "layer_summary",
           "load_checkpoint", "model_inputs", "plot_violins", "recording_attention", "restore_masked_tokens",
           "summary_markdown", "token_statistics", "write_json"]
