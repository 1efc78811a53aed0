"""BERT's WordPiece tokenizer (google-research ``bert/tokenization.py``'s algorithm), and fairseq's
``--bpe wordpiece`` on top of it: the hub interface of a converted Google checkpoint tokenizes with
it (docs/internals.md#bert)."""

import unicodedata
from dataclasses import dataclass, field
from typing import Iterable, List, Optional

from fairseq.data.encoders import register_bpe
from fairseq.dataclass import FairseqDataclass

from ...errors import DataError

UNK = "[UNK]"
MAX_WORD_CHARS = 200  # google-research bert/tokenization.py


def _is_whitespace(ch: str) -> bool:
    return ch in " \t\n\r" or unicodedata.category(ch) == "Zs"


def _is_control(ch: str) -> bool:
    return ch not in "\t\n\r" and unicodedata.category(ch) in ("Cc", "Cf")


def _is_punctuation(ch: str) -> bool:
    cp = ord(ch)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True  # all non-alphanumeric ASCII, as BERT
    return unicodedata.category(ch).startswith("P")


_CJK = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F), (0x2B740, 0x2B81F),
        (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


def _is_cjk(ch: str) -> bool:
    cp = ord(ch)
    return any(lo <= cp <= hi for lo, hi in _CJK)


def _strip_accents(word: str) -> str:
    return "".join(c for c in unicodedata.normalize("NFD", word) if unicodedata.category(c) != "Mn")


def _split_punctuation(word: str) -> List[str]:
    pieces: List[str] = []
    current = ""
    for ch in word:
        if _is_punctuation(ch):
            if current:
                pieces.append(current)
            pieces.append(ch)
            current = ""
        else:
            current += ch
    if current:
        pieces.append(current)
    return pieces


def is_uncased(vocab: Iterable[str]) -> bool:
    """An uncased (lower-cased) vocabulary has no upper-case letter outside ``[SPECIAL]`` tokens."""
    return not any(t != t.lower() for t in vocab if not (t.startswith("[") and t.endswith("]")))


class WordPieceTokenizer:
    """Text -> WordPiece tokens, as BERT's ``FullTokenizer``."""

    def __init__(self, vocab: Iterable[str], lowercase: Optional[bool] = None, unk: str = UNK):
        self.vocab = set(vocab)
        self.lowercase = is_uncased(self.vocab) if lowercase is None else lowercase
        self.unk = unk

    @classmethod
    def from_file(cls, path: str, lowercase: Optional[bool] = None) -> "WordPieceTokenizer":
        """``vocab.txt``: one token a line. ``lowercase=None``: as the vocabulary is (uncased or not)."""
        try:
            with open(path, encoding="utf-8") as f:
                vocab = [line.rstrip("\n") for line in f]
        except (OSError, UnicodeDecodeError) as e:
            raise DataError(f"cannot read the WordPiece vocabulary {path}: {e}") from None
        return cls(vocab, lowercase)

    def basic_tokens(self, text: str) -> List[str]:
        """BERT's ``BasicTokenizer``: cleaning, CJK, case, accents, punctuation."""
        text = "".join(" " if _is_whitespace(c) else c for c in text
                       if not (c == "\0" or c == "\ufffd" or _is_control(c)))
        text = "".join(f" {c} " if _is_cjk(c) else c for c in text)
        tokens: List[str] = []
        for word in text.split():
            if self.lowercase:
                word = _strip_accents(word.lower())
            tokens.extend(_split_punctuation(word))
        return " ".join(tokens).split()

    def wordpieces(self, word: str) -> List[str]:
        """Greedy longest-match-first pieces of one word; ``[UNK]`` if any part has no match."""
        if len(word) > MAX_WORD_CHARS:
            return [self.unk]
        pieces, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start:
                piece = word[start:end] if start == 0 else "##" + word[start:end]
                if piece in self.vocab:
                    break
                end -= 1
            else:
                return [self.unk]
            pieces.append(piece)
            start = end
        return pieces

    def tokenize(self, text: str) -> List[str]:
        return [piece for word in self.basic_tokens(text) for piece in self.wordpieces(word)]

    @staticmethod
    def detokenize(tokens: Iterable[str]) -> str:
        """Pieces joined back into words (``##`` pieces glued to the previous one)."""
        return " ".join(tokens).replace(" ##", "").strip()


@dataclass
class WordPieceConfig(FairseqDataclass):
    wordpiece_vocab: str = field(default="???", metadata={"help": "BERT WordPiece vocab.txt (one token a line)"})
    wordpiece_lowercase: Optional[bool] = field(
        default=None,
        metadata={"help": "lower-case and strip accents (an uncased vocabulary); default: "
                          "as the vocabulary is (no upper-case letters = uncased)"},
    )


@register_bpe("wordpiece", dataclass=WordPieceConfig)
class WordPieceBPE:
    """``--bpe wordpiece --wordpiece-vocab vocab.txt``: BERT's tokenizer as a fairseq BPE."""

    def __init__(self, cfg):
        self.tokenizer = WordPieceTokenizer.from_file(cfg.wordpiece_vocab, cfg.wordpiece_lowercase)

    def encode(self, x: str) -> str:
        return " ".join(self.tokenizer.tokenize(x))

    def decode(self, x: str) -> str:
        return self.tokenizer.detokenize(x.split())

    def is_beginning_of_word(self, x: str) -> bool:
        return not x.startswith("##")
