"""fairseq's RoBERTa hub interface, laying sentence pairs out as BERT does for models
that have segment embeddings (converted Google checkpoints)."""

from fairseq.data.encoders.hf_bert_bpe import BertBPE
from fairseq.models.roberta import RobertaHubInterface

from .wordpiece import WordPieceBPE


class RealFormerBertHubInterface(RobertaHubInterface):
    """``encode``, ``extract_features``, ``fill_mask``, ``predict`` as RoBERTa's.

    For a model with segment embeddings (``--num-segments``), ``encode(a, b)`` gives
    BERT's ``<s> A </s> B </s>`` (``[CLS] A [SEP] B [SEP]``), the layout its segment ids
    are derived from, instead of RoBERTa's doubled separator ``<s> A </s> </s> B </s>``;
    ``no_separator`` still chooses either way explicitly.
    """

    @property
    def bert_pairs(self) -> bool:
        return (getattr(self.model.encoder.sentence_encoder, "num_segments", 0) or 0) > 0

    def encode(self, sentence: str, *addl_sentences, no_separator=None):
        if no_separator is None:
            no_separator = self.bert_pairs
        return super().encode(sentence, *addl_sentences, no_separator=no_separator)

    def fill_mask(self, masked_input: str, topk: int = 5):
        """RoBERTa's, with the filled-in sentence spaced right for WordPiece (fairseq
        glues a whole-word token to the word before ``<mask>``)."""
        filled = super().fill_mask(masked_input, topk=topk)
        if not isinstance(self.bpe, (WordPieceBPE, BertBPE)) or " <mask>" not in masked_input:
            return filled
        return [
            (masked_input.replace(" <mask>", token[2:] if token.startswith("##") else " " + token, 1), prob, token)
            for _, prob, token in filled
        ]
