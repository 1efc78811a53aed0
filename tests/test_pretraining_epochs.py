"""Pre-training data that must change every epoch does, whatever ``--num-workers``:

* the ``masked_lm_nsp`` pairs and masks are redrawn each epoch with DataLoader workers as
  without, and each epoch's draw with workers equals the draw without them, by the task
  itself (its datasets cannot reuse an epoch's batch iterator): with the fixes to fairseq
  off as well as on;
* fairseq's own ``--task masked_lm`` masks (RoBERTa's dynamic masking) too, with the data
  fix ``fairseq_fixes.epoch_workers`` (without it, workers serve epoch 1's draw forever);
* the same through ``fairseq-train`` (a probe criterion hashes every training sample;
  ``masked_lm_nsp`` plain, without the launcher's fixes, fairseq's defaults);
* only there: ``--task translation`` keeps its DataLoader workers across epochs (its items
  do not change), while ``masked_lm`` and ``masked_lm_nsp`` get new ones each epoch;
* a sentence pair holds no ``</s>`` but its two separators: a line's own ``</s>`` is not
  in a segment, so it is never masked nor predicted.
"""

import json
import random
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest
import torch
from fairseq.tasks.masked_lm import MaskedLMConfig, MaskedLMTask
from inprocess import run_in_process

from realformer_nmt.errors import DataError
from realformer_nmt.tasks.masked_lm_nsp import MaskedLMNextSentenceTask, MaskedLMNSPConfig
from realformer_nmt.tasks.next_sentence_pairs import NextSentencePairsDataset
from realformer_tools.data import pretraining
from realformer_tools.fairseq_fixes import epoch_workers
from realformer_tools.launch import fixes_installed

PROBE = str(Path(__file__).resolve().parent / "epoch_probe")
WORDS = "the cat dog bird sat ran flew over under near a red blue green house tree river and".split()


@pytest.fixture(scope="module")
def short_lines(tmp_path_factory):
    """A prepared pre-training dir of many documents of short lines (2-4 words): a line's
    ``</s>`` would be a large share of the tokens of a segment."""
    raw = tmp_path_factory.mktemp("raw")
    rng = random.Random(0)
    for name, docs in (("train.txt", 30), ("valid.txt", 6)):
        out = []
        for d in range(docs):
            out += ["", f" = Article {d} = ", ""]
            for _ in range(rng.randint(3, 8)):
                out += [" " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 4))), ""]
        (raw / name).write_text("\n".join(out) + "\n", encoding="utf-8")
    dest = tmp_path_factory.mktemp("prepared") / "bin"
    pretraining.prepare_pretraining(str(raw), str(dest), vocab_size=60, log=lambda m: None)
    return dest


def nsp_task(data):
    task = MaskedLMNextSentenceTask.setup_task(MaskedLMNSPConfig(data=str(data), tokens_per_sample=32, seed=1))
    task.load_dataset("train")
    return task


def mlm_task(data):
    task = MaskedLMTask.setup_task(MaskedLMConfig(data=str(data), tokens_per_sample=32, seed=1,
                                                  sample_break_mode="complete"))
    task.load_dataset("train")
    return task


def epoch_draws(task, num_workers, epochs=3):
    """What each sample is in each epoch, read as fairseq-train reads it: one cached
    batch iterator, ``next_epoch_itr`` once per epoch, every batch consumed."""
    dataset = task.dataset("train")
    draws = []
    for epoch in range(1, epochs + 1):
        itr = task.get_batch_iterator(dataset, max_sentences=8, seed=1, num_workers=num_workers, epoch=epoch)
        samples = {}
        for batch in itr.next_epoch_itr(shuffle=False):
            nsp = batch.get("nsp_target")
            for row, index in enumerate(batch["id"].tolist()):
                samples[index] = (tuple(batch["net_input"]["src_tokens"][row].tolist()),
                                  tuple(batch["target"][row].tolist()),
                                  None if nsp is None else int(nsp[row]))
        draws.append(samples)
    if getattr(itr, "dataloader", None) is not None:
        # shut the last epoch's workers down now: left to the garbage collector, each
        # takes fairseq's 5-second join timeout, in whichever later test collects it
        epoch_workers.close_workers(itr.dataloader)
    return draws


@pytest.mark.parametrize("make_task", [nsp_task, mlm_task], ids=["masked_lm_nsp", "fairseq_masked_lm"])
def test_workers_redraw_every_epoch_as_the_main_process_does(short_lines, make_task):
    """With the data fixes (the launcher's --data-fixes: epoch_workers)."""
    with fixes_installed(data_fixes=True, quiet=True):
        reference = epoch_draws(make_task(short_lines), num_workers=0)
        for epoch in range(1, 3):  # each epoch is a new draw of (nearly) every sample
            changed = sum(reference[epoch][i] != reference[0][i] for i in reference[0])
            assert changed > 0.9 * len(reference[0]), f"epoch {epoch + 1}: only {changed} samples changed"
        for workers in (1, 2):
            assert epoch_draws(make_task(short_lines), num_workers=workers) == reference, f"--num-workers {workers}"


@pytest.mark.parametrize("workers", [1, 2])
def test_masked_lm_nsp_redraws_every_epoch_without_the_data_fix(short_lines, workers):
    """Our own task is right by default: with ``epoch_workers`` uninstalled (fairseq's own
    iterators), the batches of epochs 1-3 differ with ``--num-workers`` 1 and 2, and are what
    the main process alone draws."""
    task = nsp_task(short_lines)
    assert not task.can_reuse_epoch_itr(task.dataset("train"))
    assert not fixed(), "the test process has no fixes (importing the plugin installs nothing)"
    draws = epoch_draws(task, num_workers=workers)
    reference = epoch_draws(nsp_task(short_lines), num_workers=0)
    assert draws == reference
    for epoch in (1, 2):
        changed = sum(draws[epoch][i] != draws[0][i] for i in draws[0])
        assert changed > 0.9 * len(draws[0]), f"epoch {epoch + 1}: only {changed} samples changed"


def test_fairseq_alone_serves_the_first_epochs_draw_to_workers(short_lines):
    """How to tell the patch is no longer needed: this fails once fairseq is fixed."""
    assert not fixed(), "the test process has no fixes (importing the plugin installs nothing)"
    frozen = epoch_draws(mlm_task(short_lines), num_workers=1)
    assert frozen[0] == frozen[1] == frozen[2]


def fixed():
    """Whether epoch_workers is installed in this process."""
    from fairseq.data import iterators

    return getattr(iterators.EpochBatchIterator.next_epoch_itr, "__realformer_fixed__", False)


def worker_pids_per_epoch(task, split, epochs=3, num_workers=1):
    """The pids of the DataLoader workers that served each epoch, read as fairseq-train
    reads: one cached batch iterator, ``next_epoch_itr`` once per epoch, every batch consumed."""
    dataset = task.dataset(split)
    pids = []
    for epoch in range(1, epochs + 1):
        itr = task.get_batch_iterator(dataset, max_sentences=8, seed=1, num_workers=num_workers, epoch=epoch)
        for _ in itr.next_epoch_itr(shuffle=False):
            pass
        pids.append(tuple(w.pid for w in itr.dataloader._iterator._workers))
    epoch_workers.close_workers(itr.dataloader)
    return pids


def translation_task(data):
    """``--task translation`` as fairseq-train sets it up (every option resolved)."""
    from fairseq import options, tasks

    args = options.parse_args_and_arch(options.get_training_parser(), [
        str(data), "--task", "translation", "--arch", "transformer", "-s", "src", "-t", "tgt"])
    task = tasks.setup_task(args)
    task.load_dataset("train")
    return task


def test_translation_keeps_its_workers_across_epochs(data_bin):
    """Translation pairs are the same every epoch: the workers forked in epoch 1 serve them all."""
    task = translation_task(data_bin)
    assert not epoch_workers.items_depend_on_epoch(task.dataset("train"))
    pids = worker_pids_per_epoch(task, "train")
    assert len(set(pids)) == 1 and len(pids[0]) == 1, pids


@pytest.mark.parametrize("make_task", [nsp_task, mlm_task], ids=["masked_lm_nsp", "fairseq_masked_lm"])
def test_epoch_dependent_tasks_get_new_workers_each_epoch(short_lines, make_task):
    """With the data fixes (the launcher's --data-fixes: epoch_workers)."""
    task = make_task(short_lines)
    assert epoch_workers.items_depend_on_epoch(task.dataset("train"))
    with fixes_installed(data_fixes=True, quiet=True):
        pids = worker_pids_per_epoch(task, "train")
    assert len(set(pids)) == 3, pids


def probe_run(data, tmp_path, task, workers):
    out = tmp_path / f"{task}_{workers}.jsonl"
    criterion = "masked_lm_nsp_probe" if task == "masked_lm_nsp" else "masked_lm_acc_probe"
    extra = ["--sample-break-mode", "complete"] if task == "masked_lm" else []
    # masked_lm_nsp is right by default: plain fairseq-train, no fixes; fairseq's masked_lm
    # needs the data fixes: through the launcher with --data-fixes. In this process
    # (tests/inprocess.py: the console command's function, its DataLoader workers forked from here)
    launch = dict(fixes=False) if task == "masked_lm_nsp" else dict(data_fixes=True)
    run_in_process("fairseq-train", data, "--user-dir", PROBE, "--task", task, "--criterion", criterion,
                   "--arch", "realformer_bert_small", "--encoder-layers", "1", "--encoder-embed-dim", "16",
                   "--encoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2", "--tokens-per-sample", "32",
                   "--batch-size", "8", "--optimizer", "adam", "--lr", "1e-4", "--max-epoch", "3", "--cpu",
                   "--num-workers", workers, "--disable-validation", "--no-save", "--seed", "1",
                   "--log-format", "simple", *extra, env={"EPOCH_PROBE_OUT": out}, **launch)
    per_epoch = defaultdict(dict)  # the k-th time a sample is seen is epoch k
    seen = defaultdict(int)
    for line in out.read_text().splitlines():
        for index, digest in json.loads(line).items():
            seen[index] += 1
            per_epoch[seen[index]][index] = digest
    return [per_epoch[e] for e in sorted(per_epoch)]


@pytest.mark.slow
@pytest.mark.parametrize("task", ["masked_lm_nsp", "masked_lm"])
def test_fairseq_train_feeds_new_masks_each_epoch_with_and_without_workers(short_lines, tmp_path, task):
    without = probe_run(short_lines, tmp_path, task, 0)
    with_worker = probe_run(short_lines, tmp_path, task, 1)
    assert len(without) == 3 and all(len(epoch) == len(without[0]) for epoch in without)
    assert with_worker == without  # the same samples, epoch by epoch
    for epoch in (1, 2):
        changed = sum(without[epoch][i] != without[0][i] for i in without[0])
        assert changed > 0.9 * len(without[0])


def test_pairs_hold_no_end_of_line_separator(short_lines):
    task = nsp_task(short_lines)
    d = task.source_dictionary
    dataset = task.dataset("train")
    pairs = dataset.dataset.defn["nsp_target"].pairs
    lines = pairs.lines
    text = {int(t) for i in range(len(lines)) for t in lines[i][:-1]}  # every text token of the corpus
    assert d.eos() not in text
    sample = dataset.collater([dataset[i] for i in range(len(dataset))])
    src, tgt = sample["net_input"]["src_tokens"], sample["target"]
    for row, index in enumerate(sample["id"].tolist()):
        len_a, len_b, _ = pairs.pair(index)
        end = len_a + len_b + 3
        eos_at = (src[row] == d.eos()).nonzero().flatten().tolist()
        assert eos_at == [1 + len_a, end - 1]  # the two separators, nothing else
        assert d.eos() not in tgt[row].tolist()  # never a prediction target
        plain = pairs[index].tolist()  # A + B before masking: only text tokens of the corpus
        assert set(plain) <= text and len(plain) == len_a + len_b
    # with 2-4 words a line, dropping </s> leaves segments of text only: every masked
    # position is a word piece (the masking rate over text stays BERT's 15%)
    selected = tgt.ne(d.pad())
    assert abs(selected.sum().item() / (src.ne(d.pad()).sum().item() - 3 * src.size(0)) - 0.15) < 0.03


def test_a_line_without_end_of_sentence_is_a_clear_error():

    lines = [torch.tensor([5, 6, 2]), torch.tensor([2]), torch.tensor([7, 8, 9]), torch.tensor([2]),
             torch.tensor([10, 2])]
    pairs = NextSentencePairsDataset(lines, np.array([3, 1, 3, 1, 2]), tokens_per_sample=5, split="train")
    with pytest.raises(DataError, match="line 2 of the train data does not end with </s>"):
        [pairs[i] for i in range(len(pairs))]


@pytest.mark.slow
def test_pretraining_resumed_at_an_epoch_end_is_bit_identical(short_lines, tmp_path, task="masked_lm_nsp"):
    """With the data fixes (``resume_batches``), a ``masked_lm_nsp`` run stopped after epoch 1
    and resumed from checkpoint_last.pt ends epoch 3 with the parameters of the run never
    stopped: its datasets cannot reuse an iterator, so the fix drops its epoch-1 build and
    makes fairseq's own call (a reused iterator is tests/test_compare_backbones.py's case)."""
    from realformer_tools.fairseq_fixes import safe_checkpoint_loading

    criterion = "masked_lm_nsp_probe" if task == "masked_lm_nsp" else "masked_lm_acc_probe"
    extra = ["--sample-break-mode", "complete"] if task == "masked_lm" else []

    def train(save_dir, max_epoch):
        proc = run_in_process(  # through the launcher, with the data fixes (resume_batches); in this process
            "fairseq-train", short_lines, "--user-dir", PROBE, "--task", task,
            "--criterion", criterion, "--arch", "realformer_bert_small", "--encoder-layers", "1",
            "--encoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2",
            "--tokens-per-sample", "32", "--batch-size", "8", "--optimizer", "adam", "--lr", "1e-3",
            "--max-epoch", max_epoch, "--cpu", "--disable-validation", "--no-epoch-checkpoints",
            "--save-dir", save_dir, "--seed", "1", "--log-format", "simple", *extra, data_fixes=True,
            env={"EPOCH_PROBE_OUT": tmp_path / "probe.jsonl"})
        return proc.stdout + proc.stderr

    train(tmp_path / "whole", 3)
    train(tmp_path / "resumed", 1)
    log = train(tmp_path / "resumed", 3)
    assert "(epoch 2 @ " in log  # resumed at the start of epoch 2
    with safe_checkpoint_loading.fairseq_checkpoint_types():  # weights only, fairseq's types allowed
        whole, resumed = (torch.load(tmp_path / name / "checkpoint_last.pt", map_location="cpu")["model"]
                          for name in ("whole", "resumed"))
    differing = [k for k in whole if not torch.equal(whole[k], resumed[k])]
    assert whole.keys() == resumed.keys() and not differing, differing
