"""BERT's sentence pairs for next-sentence prediction, on fairseq's line datasets whose EOS-only lines
separate documents: segments cut once, pairs drawn per epoch and index (docs/internals.md#bert).
"""

from functools import lru_cache

import numpy as np
import torch
from fairseq.data import BaseWrapperDataset, FairseqDataset

from ..errors import DataError

SPECIAL_TOKENS = 3  # <s>, the separator and the final </s>


def segment_size_for(tokens_per_sample: int) -> int:
    """The longest segment such that ``<s> A </s> B </s>`` fits ``tokens_per_sample``."""
    return (tokens_per_sample - SPECIAL_TOKENS) // 2


def document_spans(sizes):
    """``[(first_line, end_line)]`` of the documents: runs of lines with text (``sizes`` > 0)."""
    spans, start = [], None
    for i, size in enumerate(sizes):
        if size > 0 and start is None:
            start = i
        elif size <= 0 and start is not None:
            spans.append((start, i))
            start = None
    if start is not None:
        spans.append((start, len(sizes)))
    return spans


def build_segments(sizes, segment_size):
    """``(segments, segment_doc)``: every document cut into ``(start, end)`` spans of at most
    ``segment_size`` tokens of the flat text stream (``sizes``: text tokens per line), and their documents."""
    if segment_size < 1:
        raise DataError("--tokens-per-sample is too small for a sentence pair (need at least 5)")
    sizes = np.asarray(sizes, dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    segments, segment_doc = [], []
    for doc, (first, end) in enumerate(document_spans(sizes)):
        seg_start = seg_end = offsets[first]
        for line in range(first, end):
            line_start, line_end = offsets[line], offsets[line + 1]
            size = line_end - line_start
            if seg_end - seg_start + size <= segment_size:
                seg_end = line_end  # the whole line fits: pack it
                continue
            if seg_end > seg_start:
                segments.append((seg_start, seg_end))
                segment_doc.append(doc)
            if size <= segment_size:
                seg_start, seg_end = line_start, line_end
                continue
            pieces = -(-size // segment_size)  # a long line: near-equal pieces
            bounds = line_start + (np.arange(pieces + 1) * size) // pieces
            for a, b in zip(bounds[:-2], bounds[1:-1]):
                segments.append((int(a), int(b)))
                segment_doc.append(doc)
            seg_start, seg_end = bounds[-2], line_end
        if seg_end > seg_start:
            segments.append((seg_start, seg_end))
            segment_doc.append(doc)
    return np.asarray(segments, dtype=np.int64).reshape(-1, 2), np.asarray(segment_doc, dtype=np.int64)


class NextSentencePairsDataset(FairseqDataset):
    """Item ``i``: the tokens of ``A + B`` (no special tokens) for pair ``i``; ``pair(i)``: its
    ``(len_a, len_b, is_next)``, both functions of ``(seed, epoch, i)`` only."""

    def __init__(self, lines, sizes, tokens_per_sample, seed=1, next_prob=0.5, split="train", eos=2):
        super().__init__()
        self.lines = lines
        self.eos = eos
        self.split = split
        self.segment_size = segment_size_for(tokens_per_sample)
        self.seed = seed
        self.next_prob = next_prob
        sizes = np.maximum(np.asarray(sizes, dtype=np.int64) - 1, 0)  # text tokens: the line's EOS left out
        self.offsets = np.concatenate([[0], np.cumsum(sizes)])
        self.segments, self.segment_doc = build_segments(sizes, self.segment_size)
        n_docs = int(self.segment_doc.max()) + 1 if len(self.segment_doc) else 0
        if n_docs < 2:
            raise DataError(f"--task masked_lm_nsp needs at least 2 documents in the {split} data (found {n_docs}): "
                            "separate documents with empty lines or WikiText ' = Title = ' headings")
        # documents' segments are contiguous: [doc_first[d], doc_first[d + 1])
        self.doc_first = np.searchsorted(self.segment_doc, np.arange(n_docs + 1))
        # item i -> segment A: every other segment of a document, when one follows it
        position = np.arange(len(self.segments)) - self.doc_first[self.segment_doc]
        has_next = np.zeros(len(self.segments), dtype=bool)
        has_next[:-1] = self.segment_doc[1:] == self.segment_doc[:-1]
        self.first_segments = np.nonzero(has_next & (position % 2 == 0))[0]
        if len(self.first_segments) == 0:
            raise DataError(f"no document of the {split} data has two segments: use a smaller --tokens-per-sample")
        seg_len = self.segments[:, 1] - self.segments[:, 0]
        # size bound: B may be any segment, at most segment_size tokens
        self._sizes = seg_len[self.first_segments] + self.segment_size
        self.epoch = 1

    @property
    def sizes(self):
        """Upper bounds of ``len(A) + len(B)`` (B changes with the epoch)."""
        return self._sizes

    def __len__(self):
        return len(self.first_segments)

    @property
    def can_reuse_epoch_itr_across_epochs(self):
        """False: the pairs are redrawn each epoch (docs/internals.md#bert)."""
        return False

    def set_epoch(self, epoch, **unused):
        super().set_epoch(epoch)
        self.epoch = epoch

    def pair(self, index):
        """``(len_a, len_b, is_next)`` of pair ``index`` in the current epoch."""
        a, b, is_next = self._draw(self.seed, self.epoch, index)
        return self._len(a), self._len(b), is_next

    def __getitem__(self, index):
        return self._tokens(self.seed, self.epoch, index)

    # per-instance caches (a class-level lru_cache would keep every dataset alive), not pickled
    def _cached(self, name, maxsize, fn, *key):
        cache = self.__dict__.get(name)
        if cache is None:
            cache = self.__dict__[name] = lru_cache(maxsize=maxsize)(fn)
        return cache(*key)

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_cache_")}

    def _tokens(self, seed, epoch, index):
        return self._cached("_cache_tokens", 16, self._tokens_uncached, seed, epoch, index)

    def _draw(self, seed, epoch, index):
        """Segment indices ``(a, b)`` and the label of pair ``index``."""
        return self._cached("_cache_draw", 64, self._draw_uncached, seed, epoch, index)

    def _tokens_uncached(self, seed, epoch, index):
        a, b, _ = self._draw(seed, epoch, index)
        return torch.cat([self._read(*self.segments[a]), self._read(*self.segments[b])])

    def _draw_uncached(self, seed, epoch, index):
        a = int(self.first_segments[index])
        rng = np.random.default_rng([seed, epoch, index])
        if rng.random() < self.next_prob:
            return a, a + 1, True
        doc = self.segment_doc[a]
        lo, hi = self.doc_first[doc], self.doc_first[doc + 1]
        b = int(rng.integers(len(self.segments) - (hi - lo)))
        if b >= lo:
            b += hi - lo  # skip A's own document
        return a, b, False

    def _len(self, segment):
        start, end = self.segments[segment]
        return int(end - start)

    def _read(self, start, end):
        """Tokens ``[start, end)`` of the flat stream of text (they may span several lines)."""
        first = int(np.searchsorted(self.offsets, start, side="right")) - 1
        parts, line = [], first
        while self.offsets[line] < end:
            tokens = self.lines[line]
            if int(tokens[-1]) != self.eos:
                raise DataError(f"line {line} of the {self.split} data does not end with </s> (id {self.eos}): "
                                "binarize pre-training text with scripts/prepare_pretraining_data.py")
            lo = max(start, self.offsets[line]) - self.offsets[line]
            hi = min(end, self.offsets[line + 1]) - self.offsets[line]
            parts.append(tokens[lo:hi])
            line += 1
        return torch.cat(parts).long()

    def num_tokens(self, index):
        return self._sizes[index] + SPECIAL_TOKENS

    size = num_tokens

    @property
    def supports_prefetch(self):
        return False


class PairWithSpecialsDataset(BaseWrapperDataset):
    """``<s> A </s> B </s>`` from ``dataset`` items (``A + B``); the padding index as all three
    specials lays out MLM targets."""

    def __init__(self, dataset, pairs: NextSentencePairsDataset, bos, sep, eos):
        super().__init__(dataset)
        self.pairs = pairs
        self.bos, self.sep, self.eos = bos, sep, eos

    def __getitem__(self, index):
        item = self.dataset[index]
        len_a, len_b, _ = self.pairs.pair(index)
        assert len(item) == len_a + len_b, "pair item and layout disagree"
        out = item.new_empty(len_a + len_b + SPECIAL_TOKENS)
        out[0], out[1 + len_a], out[-1] = self.bos, self.sep, self.eos
        out[1:1 + len_a] = item[:len_a]
        out[2 + len_a:-1] = item[len_a:]
        return out

    @property
    def sizes(self):
        return self.pairs.sizes + SPECIAL_TOKENS

    def num_tokens(self, index):
        return self.pairs.num_tokens(index)

    def size(self, index):
        return self.pairs.size(index)

    def set_epoch(self, epoch):
        super().set_epoch(epoch)
        self.pairs.set_epoch(epoch)

    @property
    def can_reuse_epoch_itr_across_epochs(self):
        return self.pairs.can_reuse_epoch_itr_across_epochs  # not the masking's: it wraps the pairs


class NextSentenceLabelDataset(FairseqDataset):
    """1 when ``B`` follows ``A`` in its document, 0 when it is a random segment."""

    def __init__(self, pairs: NextSentencePairsDataset):
        super().__init__()
        self.pairs = pairs

    def __getitem__(self, index):
        return int(self.pairs.pair(index)[2])

    def __len__(self):
        return len(self.pairs)

    def collater(self, samples):
        return torch.tensor(samples, dtype=torch.long)

    def set_epoch(self, epoch):
        super().set_epoch(epoch)
        self.pairs.set_epoch(epoch)

    @property
    def can_reuse_epoch_itr_across_epochs(self):
        return self.pairs.can_reuse_epoch_itr_across_epochs
