"""The tokenizer of a Hugging Face export (``hf_export.py``).

* A converted Google checkpoint: ``BertTokenizerFast`` over BERT's ``vocab.txt``, with the
  rows of the model permuted back from fairseq's dictionary order (``google_order``).
* A model pre-trained here: a fast tokenizer built from ``spm.model`` whose ids are the
  fairseq dictionary's, reproducing SentencePiece's normalization (its character map,
  collapsed runs of spaces, no piece for leading or trailing whitespace) and fairseq's
  ``<s> pieces </s>``; ``check_tokenizer`` compares it with fairseq's ``hub.encode`` on
  raw text (the data's own valid lines as written, not text decoded back from pieces).
"""

import json
import os
import tempfile
from typing import List

from realformer_nmt.errors import ConfigError

from ..convert.google_mapping import MASK, SPECIALS

# checked against fairseq's encoding, with the data's raw valid lines when they can be found
SAMPLE_TEXT = [
    "The film was released in 2001 .",
    "The film was released in 2001 . ",  # WikiText-2's lines end with a space
    " = Robert Boulter = ",
    "Hello , world ! It 's a small test : 3.5 % of 1,000 people ( roughly ) agreed .",
    "RealFormer adds the previous layer 's attention scores to its own .",
    "  leading and  double   spaces , tabs\tand UPPER case Words",
    "Zürich , São Paulo and Kraków are cities ; naïve café .",
    "a trailing no-break space\u00a0",
    "\u00a0no-break spaces\u00a0\u00a0inside\u3000and ideographic ",
    "a next-line\u0085character , two\u0085\u0085 and \u0085 alone",  # kept by SentencePiece, dropped by fairseq
    " ",
    "   \t ",
    "",
]

# checked too when "<unk>" is a user-defined piece (WikiText's literal word): before, after and
# inside words, at the start and the end (the text "<unk>" alone is the exception: see below)
LITERAL_UNK_TEXT = [
    "A <unk>s word , a <unk> , and <unk>",
    "<unk> at the start , then  <unk>  twice <unk> <unk> .",
    " <unk> after a space , x<unk>y inside , (<unk>) in brackets , <unk>\u00a0no-break",
    "the end <unk> ",
]

# what fairseq's Dictionary.encode_line splits on (Python's \s), as an Oniguruma class
PYTHON_WHITESPACE = "[" + "".join(f"\\x{{{ord(c):x}}}" for c in map(chr, range(0x3001))
                                  if c.isspace()) + "]+"


def google_order(vocab: List[str], dictionary) -> List[int]:
    """Hugging Face (WordPiece) id ``i`` -> fairseq id, through the token strings."""
    names = dict(SPECIALS + (MASK,))
    order = []
    for i, token in enumerate(vocab):
        symbol = names.get(token, token)
        j = dictionary.index(symbol)
        if j == dictionary.unk() and symbol != "<unk>":
            raise ConfigError(f"vocab.txt line {i + 1}: {token!r} is not in the model's dictionary")
        order.append(j)
    if len(set(order)) != len(order) or len(order) != len(dictionary):
        raise ConfigError(f"vocab.txt ({len(vocab)} tokens) does not map one-to-one onto the model's dictionary "
                          f"({len(dictionary)} symbols)")
    return order


def read_vocab(path: str) -> List[str]:
    with open(path, encoding="utf-8") as f:
        vocab = [line.rstrip("\n").rstrip("\r") for line in f]
    while vocab and vocab[-1] == "":
        vocab.pop()
    return vocab


def wordpiece_tokenizer(vocab: List[str], max_length: int):
    """``BertTokenizerFast`` over BERT's ``vocab.txt`` (lower-casing as the vocabulary says)."""
    from transformers import BertTokenizerFast

    from realformer_nmt.models.realformer_bert.wordpiece import is_uncased

    with tempfile.TemporaryDirectory(prefix="wordpiece_") as tmp:
        with open(os.path.join(tmp, "vocab.txt"), "w", encoding="utf-8") as f:
            f.write("\n".join(vocab) + "\n")
        # from_pretrained(folder), not BertTokenizerFast(vocab_file=...): the latter maps every word to [UNK]
        return BertTokenizerFast.from_pretrained(tmp, do_lower_case=is_uncased(vocab), model_max_length=max_length)


def _read_model(spm_model: str):
    """The ``ModelProto`` of a SentencePiece model file."""
    from transformers.convert_slow_tokenizer import import_protobuf

    try:
        model_pb2 = import_protobuf()
    except ImportError as e:
        raise ConfigError(f"reading {spm_model} needs protobuf (pip install -e '.[hf]'): {e}") from None
    proto = model_pb2.ModelProto()
    with open(spm_model, "rb") as f:
        proto.ParseFromString(f.read())
    return proto


def user_defined_pieces(spm_model: str) -> List[str]:
    """SentencePiece's user-defined symbols (``<unk>`` in data made by prepare_pretraining_data.py)."""
    return [p.piece for p in _read_model(spm_model).pieces if p.type == 4]


def sentencepiece_tokenizer(spm_model: str, dictionary, bert_pairs: bool, max_length: int):
    """A fast tokenizer over ``spm_model`` whose ids are ``dictionary``'s (fairseq's
    ``<s> pieces </s>``; pairs as the hub lays them out). One-line error when the
    dictionary cannot be reproduced: a model type other than BPE or unigram, or a piece
    SentencePiece can produce that the dictionary lacks."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers, processors
    from tokenizers.models import BPE, Unigram
    from transformers import PreTrainedTokenizerFast

    proto = _read_model(spm_model)
    kind = proto.trainer_spec.model_type  # 1 unigram, 2 bpe
    if kind not in (1, 2):
        raise ConfigError(f"{spm_model}: SentencePiece model type {kind} (only unigram and BPE export)")
    if proto.trainer_spec.byte_fallback:
        raise ConfigError(f"{spm_model}: byte fallback is not reproducible through fairseq's dictionary")
    normal = [(p.piece, p.score) for p in proto.pieces if p.type in (1, 4)]  # NORMAL, USER_DEFINED
    symbols = [dictionary[i] for i in range(len(dictionary))]
    index = {s: i for i, s in enumerate(symbols)}
    missing = [p for p, _ in normal if p not in index and p != "<unk>"]
    if missing:
        raise ConfigError(f"the dictionary lacks {len(missing)} of {spm_model}'s pieces (e.g. {missing[:3]}): "
                          "fairseq maps them to <unk>, which no tokenizer over the pieces reproduces "
                          "(prepare the data with scripts/prepare_pretraining_data.py --full-vocabulary "
                          "before training)")
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    score = {p: s for p, s in normal}
    floor = min(score.values(), default=0.0) - 1e6
    if kind == 1:
        vocab = [(s, score.get(s, floor)) for s in symbols]
        model = Unigram(vocab, unk_id=dictionary.unk(), byte_fallback=False)
    else:
        from transformers.convert_slow_tokenizer import generate_merges

        # SentencePiece's BPE merges in the order of its pieces (transformers' own conversion)
        ranks = {p.piece: i for i, p in enumerate(proto.pieces) if p.type == 1}
        merges = generate_merges(ranks)
        # ignore_merges: a user-defined symbol (split off below) is one piece, never merged
        model = BPE({s: i for i, s in enumerate(symbols)}, merges, unk_token="<unk>", fuse_unk=True,
                    byte_fallback=False, ignore_merges=True)
    tok = Tokenizer(model)
    spec = proto.normalizer_spec
    # "first": no word boundary after a special token ("<unk>s" -> <unk> s, as SentencePiece)
    prepend = "first" if spec.add_dummy_prefix else "never"
    user_defined = [p.piece for p in proto.pieces if p.type == 4]
    # WikiText's literal "<unk>" is a user-defined piece, and the unknown token, which the tokenizer
    # matches as a whole after normalizing (an added token, normalized=True) and before the
    # pre-tokenizer could mark a word boundary before it: the normalizer puts SentencePiece's
    # lone "\u2581" there itself, for a space before it and for the dummy prefix at the start
    # (not for the whole text "<unk>": that is the token itself, normalized the same way)
    unk_is_piece = "<unk>" in user_defined
    parts = [normalizers.Precompiled(spec.precompiled_charsmap)] if spec.precompiled_charsmap else []
    if spec.remove_extra_whitespaces:
        # SentencePiece keeps no piece for trailing whitespace ("... . " -> ... "\u2581."): without
        # the strip, Metaspace would add a lone "\u2581"; leading spaces become Metaspace's "\u2581"
        parts += [normalizers.Replace(Regex(" {2,}"), " "), normalizers.Replace(Regex(" +\\z"), "")]
    if unk_is_piece:
        parts.append(normalizers.Replace(Regex(" <unk>"), "\u2581<unk>"))
        if prepend == "first":
            parts.append(normalizers.Replace(Regex("\\A<unk>(?=.)"), "\u2581<unk>"))
    if parts:
        tok.normalizer = normalizers.Sequence(parts)
    split = bool(proto.trainer_spec.split_by_whitespace)
    steps = [pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme=prepend, split=split)]
    # SentencePiece's user-defined symbols (WikiText's literal "<unk>") are whole pieces wherever
    # they stand, after the word-boundary mark: "<unk> a" -> "\u2581" "<unk>" "\u2581a"
    steps += [pre_tokenizers.Split(u, behavior="isolated") for u in user_defined]
    # fairseq joins the pieces with spaces and splits them again on Python's whitespace, so a
    # piece of whitespace SentencePiece keeps (NEL, U+0085, under nmt_nfkc) is dropped, not <unk>
    steps.append(pre_tokenizers.Split(Regex(PYTHON_WHITESPACE), behavior="removed"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme=prepend, split=split)
    bos, eos = ("<s>", dictionary.bos()), ("</s>", dictionary.eos())
    pair = "<s> $A:0 </s>:0 $B:1 </s>:1" if bert_pairs else "<s> $A </s> </s> $B </s>"
    tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", pair=pair, special_tokens=[bos, eos])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", sep_token="</s>", cls_token="<s>",
        pad_token="<pad>", model_max_length=max_length,
        # BERT's tokenizers name theirs ([UNK]): unk_token_id, and convert_tokens_to_ids of an unknown string
        unk_token=AddedToken("<unk>", special=True, normalized=True) if unk_is_piece else "<unk>",
        # lstrip: "was <mask> in" encodes as fairseq's fill_mask encodes it ("was" <mask> "\u2581in")
        mask_token=AddedToken("<mask>", lstrip=True, rstrip=False, special=True, normalized=False),
        model_input_names=["input_ids", "token_type_ids", "attention_mask"] if bert_pairs
        else ["input_ids", "attention_mask"],
    )
    for s in specials:
        if fast.convert_tokens_to_ids(s) != index.get(s):
            raise ConfigError(f"special token {s} has id {fast.convert_tokens_to_ids(s)} in the tokenizer, "
                              f"{index.get(s)} in the dictionary")
    return fast


def raw_valid_text(data_dir: str, limit: int = 200) -> List[str]:
    """Up to ``limit`` non-empty lines of the raw valid text the data was prepared from,
    exactly as written (``prepare.json``'s ``settings.raw_files.valid``); [] when the data
    dir does not say or the file is gone."""
    try:
        with open(os.path.join(data_dir, "prepare.json"), encoding="utf-8") as f:
            path = json.load(f)["settings"]["raw_files"]["valid"]
        with open(path, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return [line for line in lines if line.strip()][:limit]


def check_tokenizer(tokenizer, hub, texts: List[str]) -> int:
    """One-line error at the first text whose ids differ from fairseq's ``hub.encode``."""
    for text in texts:
        theirs = hub.encode(text).tolist()
        ours = tokenizer(text)["input_ids"]
        if ours != theirs:
            raise ConfigError(f"the exported tokenizer would encode {text[:60]!r} as {ours[:12]}..., "
                              f"fairseq as {theirs[:12]}...: refusing to export a tokenizer that differs")
    return len(texts)
