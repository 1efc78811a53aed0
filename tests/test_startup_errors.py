"""Inputs that cannot work are one line naming the flag or the file, before fairseq-train
creates ``--save-dir``: a mistyped ``--arch`` (fairseq alone: 116 lines of usage), a
``--restore-file`` that is no checkpoint (96 lines of start-up log first), a truncated
``.bin`` (a 135-line traceback at the first batch, naming no file), a split whose source and
target hold different numbers of examples (an assertion naming no file). Each leaves no
``checkpoints/...`` folder behind."""

import os
import shutil

import numpy as np
import pytest
import torch
from cli_helpers import TINY_FLAGS
from conftest import USER_DIR
from fairseq.data import indexed_dataset
from test_error_lines import assert_one_line, run_cli

from realformer_nmt.errors import CheckpointFileError, DataError, FlagValueError
from realformer_tools.fairseq_fixes import arch_choices, data_dir_checks, train_preflight

TRAIN_SRC = "train.src-tgt.src"


def _train(data, save_dir, *flags):
    return run_cli("fairseq-train", data, "--user-dir", USER_DIR, "--save-dir", save_dir, *TINY_FLAGS,
                   "--max-update", 1, *flags)


@pytest.fixture
def truncated(data_bin, tmp_path):
    """A copy of the reversal corpus whose ``train.src-tgt.src.bin`` lost its last 10 bytes."""
    data = tmp_path / "data"
    shutil.copytree(data_bin, data)
    binary = data / f"{TRAIN_SRC}.bin"
    os.truncate(binary, binary.stat().st_size - 10)
    return data


@pytest.mark.slow
def test_a_mistyped_arch_is_one_line_with_the_closest_names(data_bin, tmp_path):
    proc = _train(data_bin, tmp_path / "ckpt", "--arch", "realformer_transfomer")
    line = assert_one_line(proc, "--arch 'realformer_transfomer'", "did you mean realformer_transformer")
    assert "usage:" not in proc.stderr + proc.stdout and len(line) < 400
    assert not (tmp_path / "ckpt").exists()


@pytest.mark.slow
def test_a_restore_file_that_is_no_checkpoint_fails_before_the_save_dir_exists(data_bin, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("remember to tune the learning rate\n")
    proc = _train(data_bin, tmp_path / "checkpoints" / "run", "--arch", "transformer", "--restore-file", notes)
    assert_one_line(proc, "--restore-file", str(notes), "not a PyTorch checkpoint")
    # fails before fairseq's start-up log, and so before the launcher's line naming its fixes: nothing on stdout
    assert proc.stdout == "", proc.stdout
    assert not (tmp_path / "checkpoints").exists()


@pytest.mark.slow
def test_a_truncated_train_bin_is_one_line_before_training(truncated, tmp_path):
    proc = _train(truncated, tmp_path / "checkpoints" / "run", "--arch", "transformer")
    assert_one_line(proc, f"{truncated / TRAIN_SRC}.bin is truncated", f"{TRAIN_SRC}.idx expects")
    assert not (tmp_path / "checkpoints").exists()


def test_every_command_names_a_truncated_bin_when_it_opens_the_split(truncated):
    """fairseq-generate, fairseq-validate and fairseq-hydra-train open a split through the
    task's ``load_dataset`` (here in-process, as they do): one error naming the file."""
    from fairseq import options, tasks

    from realformer_tools.launch import fixes_installed

    with fixes_installed(quiet=True, ranks=False):  # as the launcher runs them
        args = options.parse_args_and_arch(options.get_training_parser(), [str(truncated), "--arch", "transformer"])
        task = tasks.setup_task(args)
        task.load_dataset("valid")  # intact
        with pytest.raises(DataError, match=f"{truncated / TRAIN_SRC}.bin is truncated"):
            task.load_dataset("train")


# --------------------------------------------------------------------------------------
# The checks themselves (no process started)
# --------------------------------------------------------------------------------------

def _write_dataset(prefix, rows, dtype=np.int32):
    builder = indexed_dataset.MMapIndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    for row in rows:
        builder.add_item(torch.tensor(row))
    builder.finalize(prefix + ".idx")


@pytest.mark.parametrize("dtype", [np.uint16, np.int32, np.int64])
def test_the_bin_is_checked_against_the_size_its_index_expects(tmp_path, dtype):
    prefix = str(tmp_path / "train")
    _write_dataset(prefix, [[5, 6, 7], [8, 9], [10, 11, 12, 13]], dtype)
    expected = 9 * np.dtype(dtype).itemsize  # nine tokens
    assert data_dir_checks.expected_binary_size(prefix) == os.path.getsize(prefix + ".bin") == expected
    data_dir_checks.check_binary(prefix)  # intact: passes
    os.truncate(prefix + ".bin", os.path.getsize(prefix + ".bin") - 1)
    with pytest.raises(DataError, match=f"{prefix}.bin is truncated: .* where {prefix}.idx expects"):
        data_dir_checks.check_binary(prefix)
    os.truncate(prefix + ".idx", os.path.getsize(prefix + ".idx") - 4)
    with pytest.raises(DataError, match=f"{prefix}.idx is truncated"):
        data_dir_checks.check_binary(prefix)


def test_fairseq_alone_opens_a_truncated_bin_and_fails_at_the_last_item(tmp_path):
    """What the check is for (fails once fairseq checks sizes itself)."""
    prefix = str(tmp_path / "train")
    _write_dataset(prefix, [[5, 6, 7], [8, 9, 10]])
    os.truncate(prefix + ".bin", os.path.getsize(prefix + ".bin") - 4)
    dataset = indexed_dataset.MMapIndexedDataset(prefix)  # fairseq's own class: opens it
    assert dataset[0].tolist() == [5, 6, 7]
    with pytest.raises(ValueError):
        dataset[1]
    from realformer_tools.launch import fixes_installed

    with fixes_installed(quiet=True, ranks=False), pytest.raises(DataError):  # the fix's make_dataset refuses it
        indexed_dataset.make_dataset(prefix, "mmap")


def test_only_the_named_splits_are_checked(tmp_path):
    _write_dataset(str(tmp_path / "train.en-de.en"), [[5, 6]])
    _write_dataset(str(tmp_path / "test.en-de.en"), [[5, 6]])
    os.truncate(tmp_path / "test.en-de.en.bin", 1)
    data_dir_checks.check_split_binaries(str(tmp_path), ["train", "valid"])
    with pytest.raises(DataError, match="test.en-de.en.bin is truncated"):
        data_dir_checks.check_split_binaries(str(tmp_path), ["train", "test"])


def test_a_splits_source_and_target_must_hold_as_many_examples(tmp_path):
    """``check_pair_counts`` counts each pair's examples with fairseq's own index readers (mmap
    and the legacy format): equal counts pass; one short is named with both files and counts, in
    a shard of the train split (``train1``: read only where the split combines its shards), in a
    pair stored the other way round (``valid.de-en``) and in the legacy format. A split with no
    target side, and another language pair, pass; without --source-lang the pair is fairseq's guess."""
    from types import SimpleNamespace

    d = str(tmp_path)
    for prefix, rows in (("train.en-de.en", 3), ("train.en-de.de", 3), ("train1.en-de.en", 3), ("train1.en-de.de", 2),
                         ("valid.de-en.en", 2), ("valid.de-en.de", 1), ("test.en-de.en", 2),
                         ("valid.en-fr.en", 2), ("valid.en-fr.fr", 1)):
        _write_dataset(os.path.join(d, prefix), [[5, 6]] * rows)
    task = SimpleNamespace(data=d, source_lang="en", target_lang="de")
    data_dir_checks.check_pair_counts(task, "train")  # train alone: 3 and 3
    data_dir_checks.check_pair_counts(task, "test")  # no target side: fairseq reads the source alone
    with pytest.raises(DataError, match=f"^{d}/train1.en-de.en.idx has 3 examples but {d}/train1.en-de.de.idx has 2: "):
        data_dir_checks.check_pair_counts(task, "train", combine=True)
    with pytest.raises(DataError, match=f"^{d}/valid.de-en.en.idx has 2 examples but {d}/valid.de-en.de.idx has 1"):
        data_dir_checks.check_pair_counts(task, "valid")
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    for lang, rows in (("en", 4), ("de", 3)):
        builder = indexed_dataset.IndexedDatasetBuilder(str(legacy / f"test.en-de.{lang}.bin"))
        for _ in range(rows):
            builder.add_item(torch.tensor([5, 6]))
        builder.finalize(str(legacy / f"test.en-de.{lang}.idx"))
    guessed = SimpleNamespace(data=str(legacy), source_lang=None, target_lang=None)
    assert data_dir_checks.language_pair(guessed) in (("en", "de"), ("de", "en"))
    with pytest.raises(DataError, match="test.en-de.(en|de).idx has (4|3) examples but .*test.en-de.(de|en).idx has"):
        data_dir_checks.check_pair_counts(guessed, "test")


def test_restore_file_check_passes_checkpoints_and_leaves_missing_files_to_fairseq(tmp_path):
    checkpoint = tmp_path / "checkpoint_best.pt"
    torch.save({"model": {}}, checkpoint)
    legacy = tmp_path / "legacy.pt"
    torch.save({"model": {}}, legacy, _use_new_zipfile_serialization=False)
    for ok in (checkpoint, legacy, tmp_path / "missing.pt", "checkpoint_last.pt"):
        train_preflight.check_restore_file(str(ok))
    (tmp_path / "empty.pt").write_bytes(b"")
    for bad, words in ((tmp_path / "empty.pt", "is empty"), (tmp_path, "is a folder"),
                       (tmp_path / "notes.txt", "is not a PyTorch checkpoint")):
        if bad.name == "notes.txt":
            bad.write_text("notes\n")
        with pytest.raises(CheckpointFileError, match=f"--restore-file {bad} {words}"):
            train_preflight.check_restore_file(str(bad))


def test_arch_choices_accept_every_registered_name_and_suggest_for_others():
    from fairseq.models import ARCH_MODEL_REGISTRY

    choices = arch_choices.ArchChoices()
    assert sorted(choices) == sorted(ARCH_MODEL_REGISTRY) and all(name in choices for name in ARCH_MODEL_REGISTRY)
    with pytest.raises(FlagValueError, match="did you mean transformer"):
        "transfomer" in choices  # noqa: B015
    with pytest.raises(FlagValueError, match="none of the .* registered names is close .e.g. transformer, roberta"):
        "zzzzzzzz" in choices  # noqa: B015


@pytest.mark.parametrize("name, first", [
    ("realformer", {"realformer_transformer", "realformer_bert"}),  # the README's two names, before variants
    ("Realformer-Transformer", {"realformer_transformer"}),
    ("realformer_transfomer", {"realformer_transformer"}),
    ("transfomer", {"transformer"}),
    ("realformer_bert_googl", {"realformer_bert_google"}),
])
def test_arch_suggestions_put_the_names_that_start_with_it_first(name, first):
    from fairseq.models import ARCH_MODEL_REGISTRY

    suggested = arch_choices.suggestions(name, list(ARCH_MODEL_REGISTRY))
    assert set(suggested[:len(first)]) == first and len(suggested) == 3, suggested
    assert all(a in ARCH_MODEL_REGISTRY for a in suggested)
    with pytest.raises(FlagValueError, match="did you mean " + ", ".join(suggested) + r"\?"):
        name in arch_choices.ArchChoices()  # noqa: B015
    # difflib alone (what the check used before) leaves realformer_transformer out for `realformer`
    import difflib
    if name == "realformer":
        assert "realformer_transformer" not in difflib.get_close_matches(name, list(ARCH_MODEL_REGISTRY), n=3)
