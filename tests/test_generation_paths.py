"""fairseq's own generation paths against a RealFormer checkpoint, driven the way fairseq's
``tests/test_binaries.py`` drives its transformer: ``fairseq_cli.<tool>.main`` called
in-process on argv parsed by fairseq's parsers (``fairseq-interactive`` reading a
``sys.stdin`` replaced by ``io.StringIO``), and the real command-line tools.

One checkpoint per module: the real ``fairseq-train`` CLI trains ``realformer_transformer``
(all three residual paths, dropout and attention dropout) for 120 updates on the reversal
corpus with BPE-style ``@@`` marks on the target, validating once, at the end, with
``--eval-bleu``. Each path is checked against something computed independently of it:
the corpus rule, another fairseq path (full-pass ``--score-reference`` vs incremental beam
search, greedy search vs top-k=1 sampling, binarized vs raw data, generate vs interactive,
the CLI vs in-process), sacreBLEU, or fairseq's own ``transformer`` holding the same
weights (RealFormer with paths ``none``).
"""

import io
import math
import re
from types import SimpleNamespace

import pytest
import sacrebleu
import torch
from cli_helpers import TINY_FLAGS, load_checkpoint
from conftest import USER_DIR, trains
from generation_helpers import (
    as_vanilla_transformer,
    bpe_target,
    cli,
    hypothesis_lines,
    in_process,
    parse_output,
    preprocess_in_process,
    preprocess_test_only,
    remove_bpe,
    write_bpe_reversal_corpus,
)

N_TEST = 40  # sentences in the test and the valid split
MAX_LEN = 12  # a fixed bound on hypothesis length (targets have at most 8 tokens)
# no batch-making worker processes; the length bound does not depend on the batch
FAST = ["--num-workers", "0", "--max-len-a", "0", "--max-len-b", str(MAX_LEN)]
EVAL_BLEU = ["--eval-bleu", "--eval-bleu-detok", "space", "--eval-bleu-remove-bpe",
             "--eval-bleu-args", '{"beam": 3, "max_len_a": 0, "max_len_b": %d}' % MAX_LEN,
             "--best-checkpoint-metric", "bleu", "--maximize-best-checkpoint-metric"]
PATHS_NONE = ["--model-overrides", "{'residual_attention_paths': 'none'}"]


# ----------------------------------------------------------------------------------------
# Fixtures: corpus, checkpoint, the same weights as `transformer`, shared decoder outputs
# ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("generation")
    raw = root / "raw"
    raw.mkdir()
    write_bpe_reversal_corpus(raw)
    preprocess_in_process(raw, root / "bin")
    preprocess_in_process(raw, root / "raw-impl", "--dataset-impl", "raw",
                          "--srcdict", root / "bin" / "dict.src.txt")
    text = {(split, side): (raw / f"{split}.{side}").read_text().splitlines()
            for split in ("valid", "test") for side in ("src", "tgt")}
    dictionary = {line.split()[0] for line in (root / "bin" / "dict.tgt.txt").read_text().splitlines()}
    return SimpleNamespace(bin=root / "bin", raw_impl=root / "raw-impl", text=text,
                           words={w for w in dictionary if not w.startswith("madeupword")},
                           target_words={t for line in text[("test", "tgt")] for t in line.split()})


@pytest.fixture(scope="module")
@trains
def checkpoint(corpus, tmp_path_factory):
    save = tmp_path_factory.mktemp("generation_ckpt")
    _, out, err = cli("train", [
        corpus.bin, "--user-dir", USER_DIR, "--arch", "realformer_transformer",
        "--residual-attention-paths", "encoder,decoder,cross", *TINY_FLAGS, "--num-workers", "0",
        "--lr", "5e-3", "--dropout", "0.1", "--attention-dropout", "0.1", "--max-update", "120",
        "--validate-interval", "1000", "--save-interval", "1000", "--log-format", "simple",
        *EVAL_BLEU, "--save-dir", save,
    ])
    return SimpleNamespace(path=save / "checkpoint_last.pt", log=out + err)


@pytest.fixture(scope="module")
def vanilla(checkpoint, tmp_path_factory):
    """The checkpoint's weights as fairseq's own ``transformer``."""
    return as_vanilla_transformer(checkpoint.path, tmp_path_factory.mktemp("vanilla") / "vanilla.pt")


def gen_args(corpus, ckpt, *extra, subset="test", data=None):
    return [data or corpus.bin, "--user-dir", USER_DIR, "--path", ckpt, "--gen-subset", subset,
            "--cpu", "--no-progress-bar", "--max-tokens", "2000", *FAST, *extra]


def generate(corpus, ckpt, *extra, **kw):
    return parse_output(in_process("generate", gen_args(corpus, ckpt, *extra, **kw)))


def interactive_args(corpus, ckpt, *extra):
    return [corpus.bin, "--user-dir", USER_DIR, "--path", ckpt, "--source-lang", "src",
            "--target-lang", "tgt", "--cpu", "--buffer-size", "64", "--batch-size", "64", *FAST, *extra]


@pytest.fixture(scope="module")
def beam(corpus, checkpoint):
    """In-process fairseq-generate, beam 3, on the test split (shared by several tests)."""
    return generate(corpus, checkpoint.path, "--beam", "3")


@pytest.fixture(scope="module")
def greedy(corpus, checkpoint):
    return generate(corpus, checkpoint.path, "--beam", "1")


# ----------------------------------------------------------------------------------------
# Reading the output
# ----------------------------------------------------------------------------------------


def assert_well_formed(sents, ids, nbest, words, eos_only_at_end=True):
    """Every id translated, ``nbest`` hypotheses each, best first, made of ``words``; one
    positional score per token plus EOS, all log-probabilities, the hypothesis score being
    their mean (fairseq normalizes by length with --lenpen 1).

    ``eos_only_at_end=False``: fairseq 0.12's diverse beam search can extend a hypothesis
    past an EOS (fairseq's ``transformer`` does the same, see the parity test); EOS is not
    printed, so such a hypothesis has more positional scores than printed tokens + 1.
    """
    assert sorted(sents) == sorted(ids)
    for i in ids:
        hyps = sents[i].hyps
        assert len(hyps) == nbest, (i, hyps)
        assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
        for h in hyps:
            assert h.tokens and set(h.tokens) <= words, h.tokens
            if eos_only_at_end:
                assert len(h.positional) == len(h.tokens) + 1
            assert len(h.tokens) + 1 <= len(h.positional) <= MAX_LEN + 1
            assert all(p <= 0 for p in h.positional)
            assert h.score == pytest.approx(sum(h.positional) / len(h.positional), abs=1e-3)


def same_hypotheses(a, b, tol=1e-3):
    """Same ids, same hypotheses in the same n-best order, scores within ``tol``."""
    assert sorted(a) == sorted(b)
    for i in a:
        assert [h.tokens for h in a[i].hyps] == [h.tokens for h in b[i].hyps], i
        for ha, hb in zip(a[i].hyps, b[i].hyps):
            assert ha.score == pytest.approx(hb.score, abs=tol, rel=0)
            assert ha.positional == pytest.approx(hb.positional, abs=tol, rel=0)
            assert ha.alignment == hb.alignment


def best(sents):
    return {i: s.hyps[0].tokens for i, s in sents.items()}


# ----------------------------------------------------------------------------------------
# fairseq-train --eval-bleu (the checkpoint), beam search, n-best, alignment
# ----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_eval_bleu_during_training_equals_sacrebleu_on_generate_output(corpus, checkpoint):
    """The BLEU that fairseq-train's validation reports (--eval-bleu, detok space, BPE
    removed) is sacreBLEU of fairseq-generate's de-BPE'd output against the raw references."""
    assert re.search(r"\| valid \| .*\| bleu [\d.]+", checkpoint.log), checkpoint.log[-2000:]
    state = load_checkpoint(checkpoint.path)
    assert state["optimizer_history"][-1]["num_updates"] == 120
    train_bleu = state["extra_state"]["val_loss"]  # the value of --best-checkpoint-metric bleu
    sents = generate(corpus, checkpoint.path, "--beam", "3", "--remove-bpe", subset="valid")
    assert sorted(sents) == list(range(N_TEST))
    hyps = [" ".join(sents[i].hyps[0].tokens) for i in range(N_TEST)]
    refs = [remove_bpe(t) for t in corpus.text[("valid", "tgt")]]
    assert all("@@" not in h for h in hyps)
    bleu = sacrebleu.corpus_bleu(hyps, [refs]).score
    assert bleu > 20  # the model has learnt something, so agreeing means something
    assert train_bleu == pytest.approx(bleu, abs=0.01)


def test_generate_beam_nbest_and_alignment_are_well_formed(corpus, checkpoint, beam):
    sents = generate(corpus, checkpoint.path, "--beam", "3", "--nbest", "3", "--print-alignment")
    assert_well_formed(sents, range(N_TEST), 3, corpus.target_words)
    assert best(sents) == best(beam)  # n-best and alignment do not change the best
    for i, s in sents.items():
        src = corpus.text[("test", "src")][i]
        assert s.source == src and s.target == corpus.text[("test", "tgt")][i]
        for h in s.hyps:  # hard alignment: one (source word, target word) pair per target token
            assert [t for _, t in h.alignment] == list(range(len(h.tokens)))
            assert all(0 <= j < len(src.split()) for j, _ in h.alignment)
    # the translations follow the corpus rule (reverse, upper-case, mark pairs with @@)
    correct = sum(best(sents)[i] == bpe_target(corpus.text[("test", "src")][i].split()).split()
                  for i in range(N_TEST))
    assert correct >= N_TEST // 4, correct


def test_score_reference_of_beam_output_equals_the_beam_scores(corpus, checkpoint, beam, tmp_path):
    """Beam search scores its hypotheses with cached (incremental) decoding;
    ``--score-reference`` scores the same sequences, read back as raw text
    (--dataset-impl raw), with one full teacher-forced pass. The scores must agree."""
    hyps = tmp_path / "hyps"
    hyps.mkdir()
    (hyps / "test.src").write_text("".join(line + "\n" for line in corpus.text[("test", "src")]))
    (hyps / "test.tgt").write_text("".join(" ".join(beam[i].hyps[0].tokens) + "\n" for i in range(N_TEST)))
    preprocess_test_only(hyps / "test", tmp_path / "hyps-raw", corpus.bin, "--dataset-impl", "raw")
    scored = generate(corpus, checkpoint.path, "--score-reference", "--dataset-impl", "raw",
                      data=tmp_path / "hyps-raw")
    assert sorted(scored) == list(range(N_TEST))
    for i in range(N_TEST):
        (ref,) = scored[i].hyps
        assert ref.tokens == beam[i].hyps[0].tokens
        assert ref.positional == pytest.approx(beam[i].hyps[0].positional, abs=2e-4, rel=0)
        assert ref.score == pytest.approx(beam[i].hyps[0].score, abs=1e-4, rel=0)


@pytest.fixture(scope="module")
def score_reference(corpus, checkpoint):
    return in_process("generate", gen_args(corpus, checkpoint.path, "--score-reference"))


def test_score_reference_scores_the_reference_translations(corpus, score_reference):
    sents = parse_output(score_reference)
    assert sorted(sents) == list(range(N_TEST))
    for i, s in sents.items():
        (h,) = s.hyps
        assert h.tokens == corpus.text[("test", "tgt")][i].split()
        assert len(h.positional) == len(h.tokens) + 1 and all(p <= 0 for p in h.positional)
        assert h.score == pytest.approx(sum(h.positional) / len(h.positional), abs=1e-3)


# ----------------------------------------------------------------------------------------
# Sampling, top-k, top-p, diverse beam search, prefix, retained dropout
# ----------------------------------------------------------------------------------------

SAMPLING = ["--sampling", "--beam", "2", "--nbest", "2"]


def test_sampling_is_seeded_and_differs_from_beam_search(corpus, checkpoint, beam):
    first = generate(corpus, checkpoint.path, *SAMPLING, "--seed", "3")
    assert_well_formed(first, range(N_TEST), 2, corpus.words)
    same_hypotheses(first, generate(corpus, checkpoint.path, *SAMPLING, "--seed", "3"), tol=0)
    assert best(first) != best(generate(corpus, checkpoint.path, *SAMPLING, "--seed", "4"))
    assert best(first) != best(beam)
    # two samples per sentence, drawn independently: some pairs differ
    assert any(s.hyps[0].tokens != s.hyps[1].tokens for s in first.values())


@pytest.mark.parametrize("restriction", [["--sampling-topk", "1"], ["--sampling-topp", "0.01"]],
                         ids=["top-k 1", "top-p 0.01"])
def test_sampling_restricted_to_the_best_token_is_greedy_search(corpus, checkpoint, greedy, restriction):
    """Top-k with k=1 and nucleus sampling with a tiny p can only pick the most likely
    token, at any temperature: they must reproduce greedy (beam 1) search."""
    sampled = generate(corpus, checkpoint.path, "--sampling", *restriction, "--temperature", "3",
                       "--beam", "1", "--seed", "5")
    assert best(sampled) == best(greedy)  # (temperature rescales the scores, not the choice)


@pytest.mark.parametrize("restriction", [["--sampling-topk", "3"], ["--sampling-topp", "0.9"]],
                         ids=["top-k 3", "top-p 0.9"])
def test_wider_top_k_and_top_p_sampling_explore(corpus, checkpoint, greedy, restriction):
    sampled = generate(corpus, checkpoint.path, *SAMPLING, *restriction, "--seed", "5")
    assert_well_formed(sampled, range(N_TEST), 2, corpus.words)
    assert best(sampled) != best(greedy)


def test_diverse_beam_search(corpus, checkpoint):
    flags = ["--beam", "4", "--nbest", "4"]
    diverse = generate(corpus, checkpoint.path, *flags, "--diverse-beam-groups", "2",
                       "--diverse-beam-strength", "2")
    assert_well_formed(diverse, range(N_TEST), 4, corpus.words, eos_only_at_end=False)
    plain = generate(corpus, checkpoint.path, *flags)
    assert any([h.tokens for h in diverse[i].hyps] != [h.tokens for h in plain[i].hyps]
               for i in range(N_TEST))
    with pytest.raises(ValueError):  # fairseq's own check, as in its test_generation
        generate(corpus, checkpoint.path, "--diverse-beam-groups", "4", "--match-source-len")


def test_prefix_size_forces_the_reference_prefix(corpus, checkpoint):
    sents = generate(corpus, checkpoint.path, "--beam", "3", "--prefix-size", "2")
    assert_well_formed(sents, range(N_TEST), 1, corpus.words)
    assert all(best(sents)[i][:2] == corpus.text[("test", "tgt")][i].split()[:2] for i in range(N_TEST))


def test_retain_dropout_decodes_with_dropout_on(corpus, checkpoint, beam):
    kept = generate(corpus, checkpoint.path, "--beam", "3", "--retain-dropout", "--seed", "7")
    assert_well_formed(kept, range(N_TEST), 1, corpus.words)
    changed = [i for i in range(N_TEST) if kept[i].hyps[0].positional != beam[i].hyps[0].positional]
    assert len(changed) > N_TEST // 2
    again = generate(corpus, checkpoint.path, "--beam", "3", "--retain-dropout", "--seed", "7")
    same_hypotheses(kept, again, tol=0)


# ----------------------------------------------------------------------------------------
# --max-source-positions / --max-target-positions: over-long inputs
# ----------------------------------------------------------------------------------------

MAX_POS = ["--max-source-positions", "6", "--max-target-positions", "6"]
SKIP = "--skip-invalid-size-inputs-valid-test"


def test_over_long_inputs_stop_generate_naming_the_skip_flag(corpus, checkpoint):
    with pytest.raises(Exception, match=SKIP):
        generate(corpus, checkpoint.path, *MAX_POS)
    sents = generate(corpus, checkpoint.path, *MAX_POS, SKIP)
    fits = [i for i in range(N_TEST) if len(corpus.text[("test", "src")][i].split()) + 1 <= 6
            and len(corpus.text[("test", "tgt")][i].split()) + 1 <= 6]
    assert 0 < len(fits) < N_TEST
    assert sorted(sents) == fits


def test_over_long_interactive_line_is_refused_or_skipped(corpus, checkpoint):
    lines = "a b\na b c d e f g h\nc d e\n"
    with pytest.raises(Exception, match=SKIP):
        in_process("interactive", interactive_args(corpus, checkpoint.path, *MAX_POS), stdin=lines)
    out = in_process("interactive", interactive_args(corpus, checkpoint.path, *MAX_POS, SKIP), stdin=lines)
    assert sorted(parse_output(out)) == [0, 2]


# ----------------------------------------------------------------------------------------
# fairseq-interactive: in-process with a StringIO stdin, and the CLI with invalid UTF-8
# ----------------------------------------------------------------------------------------


def test_interactive_in_process_reads_a_stringio_stdin(corpus, checkpoint, beam):
    """Issue 6: ``fairseq_cli.interactive.main`` with ``sys.stdin`` an ``io.StringIO``
    (fairseq's own tests and notebooks do this). Every line is translated, in order, as
    fairseq-generate translates the same sentences from the binarized test set."""
    sources = corpus.text[("test", "src")]
    out = in_process("interactive", interactive_args(corpus, checkpoint.path, "--beam", "3"),
                     stdin="".join(s + "\n" for s in sources))
    ids = [int(line.split("\t")[0][2:]) for line in out.splitlines() if line.startswith("H-")]
    assert ids == list(range(N_TEST))
    sents = parse_output(out)
    assert [sents[i].source for i in range(N_TEST)] == sources
    same_hypotheses(sents, beam)


def test_interactive_in_process_byte_stdin_keeps_the_callers_strict_decoding(corpus, checkpoint):
    """``sys.stdin`` a strict-decoding byte stream (``io.TextIOWrapper``), in-process: the
    invalid byte becomes <unk> while fairseq reads, and the caller's stream is strict again
    afterwards (the protection is scoped to the call)."""
    stream = io.TextIOWrapper(io.BytesIO(b"a b c\nd \xff e f\n"), encoding="utf-8", errors="strict")
    out = in_process("interactive", interactive_args(corpus, checkpoint.path, "--beam", "2"), stdin=stream)
    sents = parse_output(out)
    assert [sents[i].source for i in range(2)] == ["a b c", "d <unk> e f"]
    assert_well_formed(sents, range(2), 1, corpus.words)
    assert stream.errors == "strict"


def test_interactive_cli_translates_every_line_around_an_invalid_utf8_byte(corpus, checkpoint):
    """Real stdin decoded strictly (as under e.g. LANG=en_US.UTF-8, where fairseq 0.12
    dies): the bad byte becomes <unk> and every line is translated, with n-best lists and
    alignments equal to an in-process run on the same text."""
    flags = ["--beam", "3", "--nbest", "2", "--print-alignment"]
    stdin = b"a b c\nd \xff e f\nj i h g\n"
    _, out, err = cli("interactive", interactive_args(corpus, checkpoint.path, *flags),
                      stdin=stdin, env={"PYTHONIOENCODING": "utf-8:strict"})
    assert "input line 2 is not valid UTF-8" in out + err
    sents = parse_output(out)
    assert [sents[i].source for i in range(3)] == ["a b c", "d <unk> e f", "j i h g"]
    assert_well_formed(sents, range(3), 2, corpus.words)
    assert all(len(h.alignment) == len(h.tokens) for s in sents.values() for h in s.hyps)
    in_proc = in_process("interactive", interactive_args(corpus, checkpoint.path, *flags),
                         stdin=stdin.decode("utf-8", "replace"))
    same_hypotheses(sents, parse_output(in_proc))


# ----------------------------------------------------------------------------------------
# fairseq-train in-process: --dataset-impl raw, --update-freq, --eval-bleu
# ----------------------------------------------------------------------------------------

ONE_EPOCH = ["--max-epoch", "1", "--max-tokens", "400", *EVAL_BLEU]


def train_in_process(corpus, save, *extra, data=None):
    in_process("train", [data or corpus.bin, "--user-dir", USER_DIR, "--arch", "realformer_transformer",
                         *TINY_FLAGS, "--num-workers", "0", "--save-dir", save, *extra])
    return load_checkpoint(save / "checkpoint_last.pt")


@pytest.fixture(scope="module")
@trains
def one_epoch(corpus, tmp_path_factory):
    """In-process fairseq-train, one epoch on the binarized corpus, validated with --eval-bleu."""
    return train_in_process(corpus, tmp_path_factory.mktemp("one_epoch"), *ONE_EPOCH)


def test_dataset_impl_raw_trains_and_generates_as_binarized_data(corpus, checkpoint, one_epoch, tmp_path):
    """The same corpus as raw text (--dataset-impl raw): training gives the same weights and
    --eval-bleu the same validation BLEU as from binarized data; generation the same output."""
    raw = train_in_process(corpus, tmp_path, *ONE_EPOCH, "--dataset-impl", "raw", data=corpus.raw_impl)
    updates = one_epoch["optimizer_history"][-1]["num_updates"]
    assert raw["optimizer_history"][-1]["num_updates"] == updates > 0
    assert raw["extra_state"]["val_loss"] == one_epoch["extra_state"]["val_loss"]  # BLEU
    assert raw["model"].keys() == one_epoch["model"].keys()
    assert all(torch.equal(raw["model"][k], one_epoch["model"][k]) for k in raw["model"])
    flags = ["--beam", "3", "--print-alignment"]
    from_raw = in_process("generate", gen_args(corpus, checkpoint.path, *flags, "--dataset-impl", "raw",
                                               data=corpus.raw_impl))
    from_bin = in_process("generate", gen_args(corpus, checkpoint.path, *flags))
    assert len(parse_output(from_raw)) == N_TEST
    assert hypothesis_lines(from_raw) == hypothesis_lines(from_bin)


def test_update_freq_accumulates_batches_into_one_update(corpus, one_epoch, tmp_path):
    three = train_in_process(corpus, tmp_path, *ONE_EPOCH, "--update-freq", "3")
    batches = one_epoch["optimizer_history"][-1]["num_updates"]  # one update per batch
    assert batches >= 5
    assert three["optimizer_history"][-1]["num_updates"] == math.ceil(batches / 3)
    assert math.isfinite(three["extra_state"]["val_loss"])


# ----------------------------------------------------------------------------------------
# Paths none: exactly fairseq's transformer with the same weights
# ----------------------------------------------------------------------------------------

PARITY = {
    "beam nbest prefix alignment": ["--beam", "4", "--nbest", "2", "--prefix-size", "1", "--print-alignment"],
    "top-p sampling retained dropout": [*SAMPLING, "--sampling-topp", "0.8", "--retain-dropout", "--seed", "3"],
    "diverse beam": ["--beam", "4", "--nbest", "4", "--diverse-beam-groups", "2"],
    "score reference": ["--score-reference"],
    # the plugin's dropout modules carry fairseq's names (MultiheadAttention, ...), which
    # is what --retain-dropout-modules selects by
    "dropout retained in attention only": [
        "--beam", "2", "--retain-dropout", "--retain-dropout-modules", "[MultiheadAttention]", "--seed", "7"],
}


@pytest.mark.parametrize("flags", PARITY.values(), ids=PARITY.keys())
def test_paths_none_generates_exactly_like_fairseq_transformer(corpus, checkpoint, vanilla, flags):
    ours = in_process("generate", gen_args(corpus, checkpoint.path, *flags, *PATHS_NONE))
    theirs = in_process("generate", gen_args(corpus, vanilla, *flags))
    assert len(parse_output(theirs)) == N_TEST
    assert hypothesis_lines(ours) == hypothesis_lines(theirs)


def test_paths_none_override_changes_the_model(corpus, checkpoint, score_reference):
    """Guards the parity test: with its trained residual paths the checkpoint scores the
    references differently from paths none, so the override did reach the model."""
    none = in_process("generate", gen_args(corpus, checkpoint.path, "--score-reference", *PATHS_NONE))
    assert hypothesis_lines(score_reference) != hypothesis_lines(none)


def test_paths_none_interactive_is_fairseq_transformer(corpus, checkpoint, vanilla):
    flags = ["--beam", "3", "--nbest", "2", "--print-alignment"]
    stdin = "a b c\nj i h g f\ne\n"
    ours = in_process("interactive", interactive_args(corpus, checkpoint.path, *flags, *PATHS_NONE),
                      stdin=stdin)
    theirs = in_process("interactive", interactive_args(corpus, vanilla, *flags), stdin=stdin)
    assert len(parse_output(theirs)) == 3
    assert hypothesis_lines(ours) == hypothesis_lines(theirs)


# ----------------------------------------------------------------------------------------
# The real fairseq-generate prints what the in-process call prints
# ----------------------------------------------------------------------------------------


def test_generate_cli_prints_what_in_process_generate_prints(corpus, checkpoint):
    """The real fairseq-generate reading raw text (--dataset-impl raw) samples (top-k,
    seeded) and aligns exactly as the in-process call on the binarized data does."""
    flags = [*SAMPLING, "--sampling-topk", "3", "--print-alignment", "--seed", "11"]
    _, out, _ = cli("generate", gen_args(corpus, checkpoint.path, *flags, "--dataset-impl", "raw",
                                         data=corpus.raw_impl))
    sents = parse_output(out)
    assert_well_formed(sents, range(N_TEST), 2, corpus.words)
    assert all(len(h.alignment) == len(h.tokens) for s in sents.values() for h in s.hyps)
    same_hypotheses(sents, generate(corpus, checkpoint.path, *flags))
