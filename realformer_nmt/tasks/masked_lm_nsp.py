"""``--task masked_lm_nsp``: BERT's masked LM + next-sentence prediction objective: fairseq's
``masked_lm`` task with sentence-pair samples ``<s> A </s> B </s>`` (``next_sentence_pairs``),
BERT's 80/10/10 masking and ``nsp_target`` labels (docs/internals.md#bert).
"""

import logging
import os
from dataclasses import dataclass, field

import numpy as np
from fairseq import utils
from fairseq.data import (
    IdDataset,
    MaskTokensDataset,
    NestedDictionaryDataset,
    NumelDataset,
    NumSamplesDataset,
    RightPadDataset,
    SortDataset,
    data_utils,
)
from fairseq.dataclass import FairseqDataclass
from fairseq.tasks import register_task
from fairseq.tasks.masked_lm import MaskedLMTask
from omegaconf import II, MISSING

from ..errors import ConfigError, DataError
from .next_sentence_pairs import NextSentenceLabelDataset, NextSentencePairsDataset, PairWithSpecialsDataset

logger = logging.getLogger(__name__)

NSP_HEAD = "next_sentence"


@dataclass
class MaskedLMNSPConfig(FairseqDataclass):
    data: str = field(default=MISSING, metadata={"help": "colon separated data dirs (dict.txt, train, valid), used "
                                                         "in turn by epoch; documents are separated by empty lines"})
    tokens_per_sample: int = field(default=512, metadata={"help": "max tokens of a sentence pair <s> A </s> B </s>; "
                                                                  "A and B get at most (tokens_per_sample - 3) // 2 "
                                                                  "tokens each"})
    next_sentence_prob: float = field(default=0.5, metadata={"help": "probability that B is the segment following A "
                                                                     "(else a random segment of another document)"})
    mask_prob: float = field(default=0.15, metadata={"help": "probability of selecting a token for prediction"})
    leave_unmasked_prob: float = field(default=0.1,
                                       metadata={"help": "probability that a selected token is left unchanged"})
    random_token_prob: float = field(
        default=0.1, metadata={"help": "probability that a selected token is replaced by a random token"})
    freq_weighted_replacement: bool = field(
        default=False, metadata={"help": "sample random replacement tokens by their frequency"})
    seed: int = II("common.seed")


@register_task("masked_lm_nsp", dataclass=MaskedLMNSPConfig)
class MaskedLMNextSentenceTask(MaskedLMTask):
    """Masked LM + next-sentence prediction on sentence pairs (BERT's pre-training)."""

    cfg: MaskedLMNSPConfig
    nsp_head = NSP_HEAD

    def __init__(self, cfg: MaskedLMNSPConfig, dictionary=None):
        if not 0.0 <= cfg.next_sentence_prob <= 1.0:
            raise ConfigError(f"--next-sentence-prob must be within [0, 1], not {cfg.next_sentence_prob}")
        super().__init__(cfg, dictionary)

    @classmethod
    def setup_task(cls, cfg: MaskedLMNSPConfig, **kwargs):
        path = utils.split_paths(cfg.data)[0]
        if "://" not in path and not os.path.isfile(os.path.join(path, "dict.txt")):
            raise ConfigError(f"{os.path.join(path, 'dict.txt')} not found: {path!r} is not a pre-training data dir "
                              "(make one with scripts/prepare_pretraining_data.py)")
        return super().setup_task(cfg, **kwargs)

    def build_model(self, cfg, from_checkpoint=False):
        model = super().build_model(cfg, from_checkpoint)
        if not hasattr(model, "register_classification_head"):
            raise ConfigError("--task masked_lm_nsp needs a model with classification heads "
                              "(--arch realformer_bert_*, roberta_*)")
        if NSP_HEAD not in model.classification_heads:
            model.register_classification_head(NSP_HEAD, num_classes=2)
        return model

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        paths = utils.split_paths(self.cfg.data)
        split_path = os.path.join(paths[(epoch - 1) % len(paths)], split)
        lines = data_utils.load_indexed_dataset(split_path, self.source_dictionary, combine=combine)
        if lines is None:
            raise DataError(f"{split_path}.bin/.idx not found (--task masked_lm_nsp, split {split})")
        pairs = NextSentencePairsDataset(lines, lines.sizes, self.cfg.tokens_per_sample, seed=self.cfg.seed,
                                         next_prob=self.cfg.next_sentence_prob, split=split,
                                         eos=self.source_dictionary.eos())
        d = self.source_dictionary
        mask = dict(vocab=d, pad_idx=d.pad(), mask_idx=self.mask_idx, seed=self.cfg.seed, mask_prob=self.cfg.mask_prob,
                    leave_unmasked_prob=self.cfg.leave_unmasked_prob, random_token_prob=self.cfg.random_token_prob,
                    freq_weighted_replacement=self.cfg.freq_weighted_replacement)
        src = PairWithSpecialsDataset(MaskTokensDataset(pairs, **mask), pairs, d.bos(), d.eos(), d.eos())
        tgt = PairWithSpecialsDataset(MaskTokensDataset(pairs, return_masked_tokens=True, **mask), pairs, d.pad(),
                                      d.pad(), d.pad())
        labels = NextSentenceLabelDataset(pairs)
        logger.info("loaded %d sentence pairs (segments of at most %d tokens) from %s",
                    len(pairs), pairs.segment_size, split_path)

        with data_utils.numpy_seed(self.cfg.seed):
            shuffle = np.random.permutation(len(src))
        net_input = {"src_tokens": RightPadDataset(src, pad_idx=d.pad()),
                     "src_lengths": NumelDataset(src, reduce=False)}
        dataset = NestedDictionaryDataset(
            {"id": IdDataset(), "net_input": net_input, "target": RightPadDataset(tgt, pad_idx=d.pad()),
             "nsp_target": labels, "nsentences": NumSamplesDataset(), "ntokens": NumelDataset(src, reduce=True)},
            sizes=[src.sizes],
        )
        self.datasets[split] = SortDataset(dataset, sort_order=[shuffle, src.sizes])
