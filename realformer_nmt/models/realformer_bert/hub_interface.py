"""fairseq's RoBERTa hub interface, laying pairs out as BERT does for models with segment embeddings."""

from fairseq.data.encoders.hf_bert_bpe import BertBPE
from fairseq.models.roberta import RobertaHubInterface

from .wordpiece import WordPieceBPE


class RealFormerBertHubInterface(RobertaHubInterface):
    """RoBERTa's; with segment embeddings ``encode(a, b)`` gives BERT's ``<s> A </s> B </s>``."""

    @property
    def bert_pairs(self) -> bool:
        return (getattr(self.model.encoder.sentence_encoder, "num_segments", 0) or 0) > 0

    def encode(self, sentence: str, *addl_sentences, no_separator=None):
        if no_separator is None:
            no_separator = self.bert_pairs
        return super().encode(sentence, *addl_sentences, no_separator=no_separator)

    def fill_mask(self, masked_input: str, topk: int = 5):
        """RoBERTa's, with the filled-in sentence spaced right for WordPiece."""
        filled = super().fill_mask(masked_input, topk=topk)
        if not isinstance(self.bpe, (WordPieceBPE, BertBPE)) or " <mask>" not in masked_input:
            return filled
        return [
            (masked_input.replace(" <mask>", token[2:] if token.startswith("##") else " " + token, 1), prob, token)
            for _, prob, token in filled
        ]
