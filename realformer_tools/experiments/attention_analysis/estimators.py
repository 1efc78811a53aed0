"""The statistics of one attention distribution and how they are streamed: Shannon
entropy and the Jensen-Shannon divergence (natural log, float64), computed per real query
token as the forward pass produces each layer (:class:`LayerStream`), or for all layers of
a batch at once (:func:`token_statistics`).

Shapes: ``[B, H, T, S]`` = batch, heads, queries, keys; entropy lies in ``[0, ln S]``, JSD
in ``[0, ln 2]``.
"""

import math
from typing import Optional, Sequence, Tuple

import torch
from torch import Tensor

STATISTICS = ("entropy", "jsd")
BIN_WIDTH = 1e-3  # nats; the error bound of every median and quartile written
QUARTILES = (0.25, 0.5, 0.75)
LN2 = math.log(2.0)


def entropy(probs: Tensor) -> Tensor:
    """Shannon entropy (nats) over the last dim, with 0 ln 0 = 0; computed in float64."""
    p = probs.double()
    return torch.special.entr(p).sum(-1)


def js_divergence(p: Tensor, q: Tensor) -> Tensor:
    """Jensen-Shannon divergence (nats) over the last dim: H((p+q)/2) - (H(p)+H(q))/2,
    clipped to its range ``[0, ln 2]`` against rounding."""
    p, q = p.double(), q.double()
    jsd = entropy((p + q) / 2) - (entropy(p) + entropy(q)) / 2
    return jsd.clamp_(0.0, LN2)


CHUNK_ELEMENTS = 1 << 22  # float64 work space per step: 32 MiB


class LayerStream:
    """The statistics of one attention type on one batch, fed one layer at a time (as
    the forward pass produces them), holding only the previous layer's rows.

    ``query_real`` / ``key_real``: ``[B, T]`` / ``[B, S]``, True at real (non-padding)
    tokens. Padded queries are dropped; each real query's distribution is restricted to
    the real keys (padded keys zeroed, the row renormalized); ``padding_mass`` is the
    largest mass the model itself put on padded keys of a real query (0 when masking is
    right). Values are computed in float64, in chunks of rows.
    """

    def __init__(self, query_real: Tensor, key_real: Tensor):
        self.rows = query_real
        b, t = query_real.nonzero(as_tuple=True)
        self.keys = key_real[b]  # [N, S]: the real keys of each real query
        self.prev: Optional[Tensor] = None
        self.layers = 0
        self.padding_mass = 0.0

    @property
    def tokens(self) -> int:
        return self.keys.size(0)

    def add(self, weights: Tensor) -> Tuple[Tensor, Optional[Tensor]]:
        """``weights``: ``[H, B, T, S]`` of the next layer. Returns ``(entropy [H, N],
        jsd to the previous layer [H, N] or None)``, float64."""
        x = weights.detach()[:, self.rows].float()  # [H, N, S], real queries only
        keys = self.keys.to(x.device)
        if x.size(1):
            self.padding_mass = max(self.padding_mass, float(x.masked_fill(keys, 0).sum(-1).max()))
        x = x.masked_fill_(~keys, 0)
        x = x.div_(x.sum(-1, keepdim=True).clamp_min(torch.finfo(x.dtype).tiny))
        step = max(1, CHUNK_ELEMENTS // max(1, x.size(0) * x.size(2)))
        ent = torch.cat([entropy(x[:, i:i + step]) for i in range(0, x.size(1), step)] or
                        [x.new_zeros(x.size(0), 0, dtype=torch.float64)], 1)
        jsd = None
        if self.prev is not None:
            jsd = torch.cat([js_divergence(x[:, i:i + step], self.prev[:, i:i + step])
                             for i in range(0, x.size(1), step)] or
                            [x.new_zeros(x.size(0), 0, dtype=torch.float64)], 1)
        self.prev = x
        self.layers += 1
        return ent, jsd


def token_statistics(
    probs: Sequence[Tensor], query_real: Tensor, key_real: Tensor
) -> Tuple[Tensor, Tensor, float]:
    """Per-token values of one attention type on one batch, all layers at once.

    Args:
        probs: one ``[B, H, T, S]`` tensor per layer (layer 1 first).
        query_real / key_real: as in :class:`LayerStream`.

    Returns ``(entropies [L, H, N], jsd [L-1, H, N], padding_mass)``; N = real query tokens
    of the batch, in batch-then-position order.
    """
    stream = LayerStream(query_real, key_real)
    ents, jsds = [], []
    for p in probs:
        ent, jsd = stream.add(p.transpose(0, 1))
        ents.append(ent.cpu())
        if jsd is not None:
            jsds.append(jsd.cpu())
    heads = probs[0].size(1)
    jsd = torch.stack(jsds) if jsds else torch.zeros(0, heads, stream.tokens, dtype=torch.float64)
    return torch.stack(ents), jsd, stream.padding_mass
