"""Decoding with ``fairseq-generate`` and scoring it with BLEU.

``generate_and_score`` beam-searches a split with a checkpoint, puts the hypotheses back in
corpus order (fairseq prints them in batch order) and scores them by the corpus's BLEU
convention (``BLEU_CONVENTIONS``): sacreBLEU against the raw references, or fairseq's
tokenized BLEU as the headline with sacreBLEU of the detokenized output beside it.
"""

import os
import re
import subprocess
import time

from realformer_nmt.errors import ConfigError

from .fairseq_logs import read_log
from .fairseq_tools import RunError, cli_env, fairseq_cli


def parse_generate_output(lines):
    """``{sentence id: detokenized hypothesis}`` from the ``D-<id>`` lines of fairseq-generate.

    fairseq prints sentences in batch order (sorted by length), not corpus order; the id
    is the line number in the split, which is how the caller restores the order.
    """
    hyps = {}
    for line in lines:
        match = re.match(r"D-(\d+)\t[^\t]*\t(.*)$", line)
        if match:
            hyps[int(match.group(1))] = match.group(2)
        elif re.match(r"D-(\d+)\t[^\t]*$", line):  # an empty hypothesis
            hyps[int(line.split("\t")[0][2:])] = ""
    return hyps


def parse_generate_targets(lines):
    """``{sentence id: reference}`` from the ``T-<id>`` lines of fairseq-generate: the
    binarized reference with the BPE removed, what its tokenized BLEU scores against."""
    refs = {}
    for line in lines:
        match = re.match(r"T-(\d+)\t(.*)$", line)
        if match:
            refs[int(match.group(1))] = match.group(2)
    return refs


def paired_test_references(result, references):
    """(references, sacreBLEU ``BLEU`` options) of a paired test on runs scored like
    ``result`` (a run record with ``bleu_convention`` and ``run_dir``): the raw
    ``references`` and sacreBLEU's defaults, or, for tokenized BLEU, the ``T-`` lines of
    the run's ``generate.txt`` in corpus order, untokenized further and unsmoothed
    (sacreBLEU then computes fairseq's tokenized BLEU, the headline)."""
    if result.get("bleu_convention", "sacrebleu") != "tokenized":
        return references, {}
    targets = parse_generate_targets(read_log(os.path.join(result["run_dir"], "generate.txt")))
    # no smoothing either: fairseq's BLEU is 0 when a precision is
    return [targets[i] for i in range(len(targets))], {"tokenize": "none", "smooth_method": "none", "force": True}


def sacrebleu_score(hypotheses, references, lowercase=False):
    """Corpus sacreBLEU (13a tokenization, cased unless ``lowercase``) of detokenized text:
    (score object, signature)."""
    import sacrebleu

    bleu = sacrebleu.metrics.BLEU(lowercase=lowercase)
    result = bleu.corpus_score(hypotheses, [references])
    return result, str(bleu.get_signature())


# what prepare.json's "bleu" names -> which score is the headline, and why
BLEU_CONVENTIONS = {
    "sacrebleu": "headline: sacreBLEU (13a tokenization, cased) of the detokenized output against the raw "
                 "references, the comparable BLEU for corpora without a tokenized-BLEU tradition, such as Multi30k",
    "tokenized": "headline: fairseq-generate's tokenized BLEU (its default scorer, --scoring bleu) after "
                 "--remove-bpe, against the Moses-tokenized, lowercased references of the binarized test "
                 "set, because that is the BLEU IWSLT'14 De-En papers report (about 34.5-35 for "
                 "transformer_iwslt_de_en); beside it, sacreBLEU of the Moses-detokenized output against "
                 "the raw <seg> references, lowercased as the output is (signature recorded)",
}
BLEU_LABELS = {"sacrebleu": "sacreBLEU, detokenized, cased",
               "tokenized": "fairseq's tokenized BLEU after --remove-bpe, as IWSLT'14 papers report it; "
                            "lowercased sacreBLEU of the detokenized output in the JSON"}
_FAIRSEQ_BLEU = re.compile(r"Generate \S+ with beam=\d+: (BLEU\d* = ([-+\d.]+).*)$")


def check_convention(convention):
    if convention not in BLEU_CONVENTIONS:
        raise ConfigError(f"unknown BLEU convention {convention!r} in prepare.json (one of "
                          f"{', '.join(BLEU_CONVENTIONS)})")
    return convention


def fairseq_bleu(lines):
    """fairseq-generate's own score line (``BLEU4 = 34.85, 69.4/...``) as (text, score), or None."""
    for line in reversed(lines):
        match = _FAIRSEQ_BLEU.search(line)
        if match:
            return match.group(1), float(match.group(2))
    return None


def moses_detokenize(lines, lang):
    """``detokenizer.perl -l <lang>`` (sacremoses; unescapes ``&apos;`` and friends)."""
    from sacremoses import MosesDetokenizer

    detok = MosesDetokenizer(lang=lang)
    return [detok.detokenize(line.split()) for line in lines]


def score_hypotheses(lines, references, convention="sacrebleu", lang=None):
    """Score fairseq-generate's output ``lines`` by ``convention`` against the raw ``references``.

    ``sacrebleu``: sacreBLEU of the ``D-`` lines. ``tokenized``: fairseq's printed tokenized
    BLEU is the headline; the ``D-`` lines (tokenized, BPE removed) are Moses-detokenized
    (``lang``: the target language) and scored with lowercased sacreBLEU beside it. Returns
    ``{"bleu", "convention", "headline", "sacrebleu", "sacrebleu_score", "signature"}`` (and
    ``tokenized_bleu``: fairseq's line).
    """
    check_convention(convention)
    hyps = parse_generate_output(lines)
    if sorted(hyps) != list(range(len(references))):
        raise RunError(f"fairseq-generate returned {len(hyps)} hypotheses for {len(references)} references")
    ordered = [hyps[i] for i in range(len(references))]
    out = {"convention": convention, "headline": BLEU_CONVENTIONS[convention]}
    if convention == "sacrebleu":
        result, signature = sacrebleu_score(ordered, references)
        return dict(out, bleu=round(result.score, 2), sacrebleu=str(result), sacrebleu_score=round(result.score, 2),
                    signature=signature)
    found = fairseq_bleu(lines)
    if found is None:
        raise RunError("fairseq-generate printed no BLEU line: tokenized BLEU needs its default scorer "
                       "(no --scoring sacrebleu) on a split with targets")
    result, signature = sacrebleu_score(moses_detokenize(ordered, lang or "en"), references, lowercase=True)
    return dict(out, bleu=round(found[1], 2), tokenized_bleu=found[0], sacrebleu=str(result),
                sacrebleu_score=round(result.score, 2), signature=signature)


def generate_and_score(data, checkpoint, references, out_path, extra_args=(), subset="test",
                       log=print, label="", env=None, convention="sacrebleu", lang=None):
    """Beam-search ``subset`` with ``checkpoint`` and score it against ``references``.

    ``references`` is a file of raw (untokenized, cased) target sentences in corpus order;
    ``extra_args`` must include ``--user-dir`` and the BPE to remove (``--remove-bpe
    sentencepiece``, ``--remove-bpe subword_nmt``, or ``--bpe sentencepiece
    --sentencepiece-model ...``). ``convention`` (prepare.json's ``bleu``) and ``lang``
    (the target language) choose the score, see ``score_hypotheses``. The output of
    fairseq-generate goes to ``out_path``. Returns ``score_hypotheses``'s dict plus
    ``sentences``, ``seconds``, ``command`` and ``output``.
    """
    check_convention(convention)
    args = [str(a) for a in extra_args]
    if convention == "tokenized" and "--scoring" in args and args[args.index("--scoring") + 1] != "bleu":
        raise ConfigError("tokenized BLEU is fairseq-generate's default scorer: drop --scoring")
    cmd = [*fairseq_cli("fairseq-generate"), data, "--path", checkpoint, "--gen-subset", subset, *args]
    start = time.time()
    with open(out_path, "w", encoding="utf-8") as out:
        proc = subprocess.run([str(c) for c in cmd], stdout=out, stderr=subprocess.STDOUT,
                              env=env or cli_env())
    seconds = time.time() - start
    lines = read_log(out_path)
    if proc.returncode != 0:
        tail = "\n".join(lines[-15:])
        raise RunError(f"fairseq-generate failed with exit code {proc.returncode} (output: {out_path}):\n{tail}")
    with open(references, encoding="utf-8") as f:
        refs = [line.rstrip("\n") for line in f]
    try:
        scored = score_hypotheses(lines, refs, convention, lang)
    except RunError as exc:
        raise RunError(f"{exc} (references: {references}, output: {out_path})") from exc
    extra = "" if convention == "sacrebleu" else f", sacreBLEU {scored['sacrebleu_score']:.2f}"
    log(f"{label}test BLEU {scored['bleu']:.2f} ({convention}{extra}; {len(refs)} sentences, "
        f"decoded in {seconds:.0f}s)")
    return dict(scored, sentences=len(refs), seconds=round(seconds, 1), command=[str(c) for c in cmd],
                output=os.path.abspath(out_path))
