"""BERT's WordPiece tokenizer (``--bpe wordpiece``): the behaviour google-research
``bert/tokenization.py`` documents in its own tests, and agreement with HuggingFace's
``BertTokenizer`` on WikiText-2 (when ``transformers`` is installed)."""

import argparse
import collections
import re

import pytest
from bert_helpers import WIKITEXT2, require_shared_data
from fairseq.data import encoders

from realformer_nmt.models.realformer_bert.wordpiece import WordPieceBPE, WordPieceTokenizer, is_uncased

# the vocabulary of Google's tokenization_test.py
VOCAB = ["[UNK]", "[CLS]", "[SEP]", "want", "##want", "##ed", "wa", "un", "runn", "##ing", ","]


def test_wordpiece_is_greedy_longest_match_first():
    tok = WordPieceTokenizer(VOCAB, lowercase=True)
    assert tok.wordpieces("unwanted") == ["un", "##want", "##ed"]
    assert tok.tokenize("unwanted running") == ["un", "##want", "##ed", "runn", "##ing"]
    assert tok.tokenize("unwantedX running") == ["[UNK]", "runn", "##ing"]  # one unmatched piece: the word is [UNK]
    assert tok.tokenize("") == []


def test_basic_tokenization_lowercases_strips_accents_and_splits_punctuation():
    uncased = WordPieceTokenizer([], lowercase=True)
    assert uncased.basic_tokens(" \tHeLLo!how  \n Are yoU?  ") == ["hello", "!", "how", "are", "you", "?"]
    assert uncased.basic_tokens("H\u00e9llo") == ["hello"]
    cased = WordPieceTokenizer([], lowercase=False)
    assert cased.basic_tokens(" \tHeLLo!how  \n Are yoU?  ") == ["HeLLo", "!", "how", "Are", "yoU", "?"]
    assert cased.basic_tokens("H\u00e9llo") == ["H\u00e9llo"]


def test_cjk_characters_controls_and_long_words():
    tok = WordPieceTokenizer(["ah", "zz", "\u535a", "\u63a8", "[UNK]"], lowercase=True)
    assert tok.basic_tokens("ah\u535a\u63a8zz") == ["ah", "\u535a", "\u63a8", "zz"]
    assert tok.basic_tokens("a\u200bb\x00c\ufffd d\u3000e") == ["abc", "d", "e"]  # Cf, NUL, U+FFFD dropped; Zs splits
    assert tok.wordpieces("a" * 201) == ["[UNK]"]  # google's limit: 200 characters


def test_casing_is_read_from_the_vocabulary():
    assert is_uncased(["[PAD]", "[UNK]", "the", "##s"])
    assert not is_uncased(["[PAD]", "The", "the"])
    assert WordPieceTokenizer(["[UNK]", "the"]).tokenize("The") == ["the"]
    assert WordPieceTokenizer(["[UNK]", "The"]).tokenize("The") == ["The"]


def test_registered_as_a_fairseq_bpe(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(VOCAB) + "\n")
    bpe = encoders.build_bpe(argparse.Namespace(bpe="wordpiece", wordpiece_vocab=str(vocab)))
    assert isinstance(bpe, WordPieceBPE)
    assert bpe.encode("Unwanted, running") == "un ##want ##ed , runn ##ing"
    assert bpe.decode("un ##want ##ed , runn ##ing") == "unwanted , running"
    assert not bpe.is_beginning_of_word("##ed") and bpe.is_beginning_of_word("un")


def wikitext_vocab(lines, lowercase):
    """A WordPiece vocabulary made from the text: frequent words, every character alone and
    as a ``##`` piece, a few suffixes."""
    words = collections.Counter(w.lower() if lowercase else w for line in lines for w in re.findall(r"\w+", line))
    chars = sorted({c for w in words for c in w})
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [w for w, _ in words.most_common(3000)]
    vocab += chars + ["##" + c for c in chars] + ["##s", "##ed", "##ing", "##ly", "##er"]
    vocab += [c for c in ",.;:!?'\"()[]-@"]
    return list(dict.fromkeys(vocab))


@pytest.mark.parametrize("lowercase", [True, False])
def test_matches_huggingface_bert_tokenizer_on_wikitext(lowercase, tmp_path):
    transformers = pytest.importorskip("transformers")
    require_shared_data(WIKITEXT2)
    lines = [line for line in (WIKITEXT2 / "valid.txt").read_text(encoding="utf-8").splitlines() if line.strip()][:1500]
    lines += ["Café naïve résumé — “quoted” 北京 ½ ﬁ e\u0301", "tabs\tand\u00a0non-breaking\u2003spaces"]
    vocab = wikitext_vocab(lines, lowercase)
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(vocab) + "\n", encoding="utf-8")
    ours = WordPieceTokenizer(vocab, lowercase=lowercase)
    # HuggingFace NFC-normalises first (Google does not): compare on NFC text
    import unicodedata
    theirs = transformers.BertTokenizer(str(path), do_lower_case=lowercase)
    for line in lines:
        line = unicodedata.normalize("NFC", line)
        assert ours.tokenize(line) == theirs.tokenize(line), line
