"""Google's RealFormer BERT written out in plain NumPy (float64), from the TF variables.

Independent of the code under test: it reads nothing but the variables by their TF
names and follows google-research ``realformer/realformer.py`` (``BertModel``) and BERT's
``run_pretraining.py`` heads line by line:

* embeddings: word + token type + position (rows 0..T-1), LayerNorm (epsilon 1e-12, as
  tf_slim's ``layer_norm``);
* each layer: Q, K, V from 2-D kernels (head h = columns h*d..(h+1)*d), raw scores
  ``Q K^T / sqrt(d)`` added to the previous layer's running sum (``residual=True``), the
  sum divided by layer index + 1 when ``use_running_mean``, then ``-10000`` added at padded
  keys, softmax, context, output dense, residual + LayerNorm; FFN with tanh-GELU, residual
  + LayerNorm (Post-LN). The *unmasked* running sum goes to the next layer;
* pooler: dense + tanh on the first token;
* MLM head: dense + GELU + LayerNorm, times the word embeddings transposed, plus
  ``output_bias``; NSP head: pooled times ``output_weights`` transposed plus bias
  (class 0 = "is next", BERT's convention).

``residual=False`` is vanilla BERT (google-research ``bert/modeling.py``) of the same weights.
"""

import numpy as np

EPS = 1e-12


def gelu(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def layer_norm(x, v, prefix):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + EPS) * v[prefix + "/gamma"] + v[prefix + "/beta"]


def dense(x, v, prefix):
    return x @ v[prefix + "/kernel"] + v[prefix + "/bias"]


def encoder(v, config, input_ids, input_mask, token_type_ids, residual=True):
    """``(sequence_output [B, T, H], pooled_output [B, H])``."""
    v = {k: np.asarray(a, dtype=np.float64) for k, a in v.items()}
    input_ids = np.asarray(input_ids)
    batch, length = input_ids.shape
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    d = hidden // heads
    act = {"gelu": gelu, "relu": lambda x: np.maximum(x, 0), "tanh": np.tanh}[config["hidden_act"]]

    x = (v["bert/embeddings/word_embeddings"][input_ids]
         + v["bert/embeddings/token_type_embeddings"][np.asarray(token_type_ids)]
         + v["bert/embeddings/position_embeddings"][:length][None])
    x = layer_norm(x, v, "bert/embeddings/LayerNorm")
    adder = (1.0 - np.asarray(input_mask, dtype=np.float64))[:, None, None, :] * -10000.0  # [B, 1, 1, T]

    def split(t):  # [B, T, N*d] -> [B, N, T, d]
        return t.reshape(batch, length, heads, d).transpose(0, 2, 1, 3)

    prev = None
    for i in range(config["num_hidden_layers"]):
        p = f"bert/encoder/layer_{i}"
        q = split(dense(x, v, f"{p}/attention/self/query"))
        k = split(dense(x, v, f"{p}/attention/self/key"))
        val = split(dense(x, v, f"{p}/attention/self/value"))
        scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d)  # [B, N, F, T]
        if residual and prev is not None:
            scores = scores + prev
        if residual:
            prev = scores
        logits = scores / (i + 1.0) if (residual and config.get("use_running_mean")) else scores
        logits = logits + adder
        probs = np.exp(logits - logits.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        context = (probs @ val).transpose(0, 2, 1, 3).reshape(batch, length, hidden)
        attention = dense(context, v, f"{p}/attention/output/dense")
        attention = layer_norm(attention + x, v, f"{p}/attention/output/LayerNorm")
        ffn = dense(act(dense(attention, v, f"{p}/intermediate/dense")), v, f"{p}/output/dense")
        x = layer_norm(ffn + attention, v, f"{p}/output/LayerNorm")
    pooled = np.tanh(dense(x[:, 0], v, "bert/pooler/dense"))
    return x, pooled


def mlm_logits(v, config, sequence):
    """``[..., vocab]`` logits of BERT's masked-LM head at every position given."""
    v = {k: np.asarray(a, dtype=np.float64) for k, a in v.items()}
    act = {"gelu": gelu, "relu": lambda x: np.maximum(x, 0), "tanh": np.tanh}[config["hidden_act"]]
    h = layer_norm(act(dense(sequence, v, "cls/predictions/transform/dense")), v, "cls/predictions/transform/LayerNorm")
    return h @ v["bert/embeddings/word_embeddings"].T + v["cls/predictions/output_bias"]


def nsp_logits(v, pooled):
    """``[B, 2]`` logits of BERT's next-sentence head (class 0 = is next)."""
    return (pooled @ np.asarray(v["cls/seq_relationship/output_weights"], dtype=np.float64).T
            + np.asarray(v["cls/seq_relationship/output_bias"], dtype=np.float64))
