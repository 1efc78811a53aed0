"""RealFormer written out plainly from the paper, for tests.

Independent of the code under test: it reads the model's weights (by fairseq's
parameter names) and recomputes every layer with explicit tensor algebra,

    A_n = Q_n K_n^T / sqrt(d_head) + A_{n-1};   P_n = softmax(mask(A_n / c_n));   out = P_n V_n W_o

with the unmasked A_n handed to layer n+1, masks applied after the sum, and a
Post-LN (or Pre-LN) residual block around every sub-layer.
"""

import math

import torch
import torch.nn.functional as F


def attention(p, x_q, x_kv, heads, prev, key_pad, causal, residual, mode, n, causal_offset=0):
    """One attention sub-layer. x_*: [B, L, C]; returns (out [B, T, C], A_n or None).

    ``n``: the number of layers in the running sum (mean mode divides by it);
    ``causal_offset``: keys before the target positions that every query may see
    (the encoder states of --cross-self-attention)."""
    B, T, C = x_q.shape
    S = x_kv.shape[1]
    d = C // heads
    q = F.linear(x_q, p["q_proj.weight"], p["q_proj.bias"]).view(B, T, heads, d).transpose(1, 2)
    k = F.linear(x_kv, p["k_proj.weight"], p["k_proj.bias"]).view(B, S, heads, d).transpose(1, 2)
    v = F.linear(x_kv, p["v_proj.weight"], p["v_proj.bias"]).view(B, S, heads, d).transpose(1, 2)
    A = q @ k.transpose(-1, -2) / math.sqrt(d)  # [B, H, T, S]
    if residual and prev is not None:
        A = A + prev
    logits = A / n if (residual and mode == "mean") else A
    if key_pad is not None:
        logits = logits.masked_fill(key_pad[:, None, None, :], float("-inf"))
    if causal:
        future = torch.ones(T, S, dtype=torch.bool).triu(1 + causal_offset)
        logits = logits.masked_fill(future, float("-inf"))
    P = torch.softmax(logits, dim=-1)
    out = (P @ v).transpose(1, 2).reshape(B, T, C)
    out = F.linear(out, p["out_proj.weight"], p["out_proj.bias"])
    return out, (A if residual else None)


def _ln(p, name, x):
    return F.layer_norm(x, x.shape[-1:], p[name + ".weight"], p[name + ".bias"])


def _sub(p, prefix):
    return {k[len(prefix):]: v for k, v in p.items() if k.startswith(prefix)}


def _block(p, ln_name, x, fn, pre_ln):
    """Post-LN: LN(x + f(x)); Pre-LN: x + f(LN(x))."""
    if pre_ln:
        return x + fn(_ln(p, ln_name, x))
    return _ln(p, ln_name, x + fn(x))


def _ffn(p, x):
    return F.linear(F.relu(F.linear(x, p["fc1.weight"], p["fc1.bias"])), p["fc2.weight"], p["fc2.bias"])


def encoder(params, x, src_pad, layers, heads, paths, mode, pre_ln=False, kept=None):
    """x: embedded source [B, S, C] -> encoder states [B, S, C].

    ``kept``: the indices of the layers that run (layerdrop / --encoder-layers-to-keep);
    the n-th layer that runs is layer n of the running sum."""
    prev = None
    for n, i in enumerate(range(layers) if kept is None else kept, start=1):
        p = _sub(params, f"encoder.layers.{i}.")
        res = "encoder" in paths

        def self_attn(h, p=p, res=res, n=n):
            nonlocal prev
            out, A = attention(_sub(p, "self_attn."), h, h, heads, prev, src_pad, False, res, mode, n)
            prev = A
            return out

        x = _block(p, "self_attn_layer_norm", x, self_attn, pre_ln)
        x = _block(p, "final_layer_norm", x, lambda h, p=p: _ffn(p, h), pre_ln)
    if pre_ln:
        x = _ln(params, "encoder.layer_norm", x)
    return x


def decoder(params, y, enc, src_pad, layers, heads, paths, mode, pre_ln=False, kept=None,
            cross_self=False):
    """y: embedded target prefix [B, T, C] -> features [B, T, C] (before the output projection).

    ``kept`` as in :func:`encoder`; ``cross_self``: fairseq's --cross-self-attention,
    self-attention keys ``[encoder states; target prefix]``."""
    prev_self = prev_cross = None
    for n, i in enumerate(range(layers) if kept is None else kept, start=1):
        p = _sub(params, f"decoder.layers.{i}.")

        def self_attn(h, p=p, n=n):
            nonlocal prev_self
            keys, pad, offset = h, None, 0
            if cross_self:
                keys, offset = torch.cat([enc, h], dim=1), enc.shape[1]
                pad = torch.cat([src_pad, src_pad.new_zeros(h.shape[:2])], dim=1)
            out, prev_self = attention(
                _sub(p, "self_attn."), h, keys, heads, prev_self, pad, True, "decoder" in paths, mode, n,
                causal_offset=offset,
            )
            return out

        def cross_attn(h, p=p, n=n):
            nonlocal prev_cross
            out, prev_cross = attention(
                _sub(p, "encoder_attn."), h, enc, heads, prev_cross, src_pad, False, "cross" in paths, mode, n
            )
            return out

        y = _block(p, "self_attn_layer_norm", y, self_attn, pre_ln)
        y = _block(p, "encoder_attn_layer_norm", y, cross_attn, pre_ln)
        y = _block(p, "final_layer_norm", y, lambda h, p=p: _ffn(p, h), pre_ln)
    if pre_ln:
        y = _ln(params, "decoder.layer_norm", y)
    return y
