"""Through fairseq's real command-line tools: preprocess -> train -> generate."""

import random
import subprocess

import pytest
import torch

from conftest import BIN, USER_DIR, cli_env

TINY_FLAGS = (
    "--encoder-layers 2 --decoder-layers 2 --encoder-embed-dim 32 --decoder-embed-dim 32 "
    "--encoder-ffn-embed-dim 64 --decoder-ffn-embed-dim 64 "
    "--encoder-attention-heads 2 --decoder-attention-heads 2 "
    "--optimizer adam --lr 1e-3 --max-tokens 2000 --cpu --no-progress-bar --log-interval 10 "
    "--no-epoch-checkpoints --seed 1"
).split()


def run(tool, *args, check=True, input=None):
    proc = subprocess.run(
        [str(BIN / tool), *map(str, args)], capture_output=True, text=True, env=cli_env(),
        input=input, timeout=600,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"{tool} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc


def write_reversal_corpus(raw):
    """A tiny real task: reverse a letter sequence and upper-case it."""
    rng = random.Random(0)
    for split, n in [("train", 400), ("valid", 40), ("test", 40)]:
        src, tgt = [], []
        for _ in range(n):
            s = [rng.choice("abcdefghij") for _ in range(rng.randint(3, 8))]
            src.append(" ".join(s))
            tgt.append(" ".join(c.upper() for c in reversed(s)))
        (raw / f"{split}.src").write_text("\n".join(src) + "\n")
        (raw / f"{split}.tgt").write_text("\n".join(tgt) + "\n")


@pytest.fixture(scope="module")
def data_bin(tmp_path_factory):
    raw = tmp_path_factory.mktemp("raw")
    write_reversal_corpus(raw)
    dest = tmp_path_factory.mktemp("bin")
    run(
        "fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt",
        "--trainpref", raw / "train", "--validpref", raw / "valid", "--testpref", raw / "test",
        "--destdir", dest, "--workers", "1", "--joined-dictionary",
    )
    return dest


@pytest.fixture(scope="module")
def trained(data_bin, tmp_path_factory):
    save = tmp_path_factory.mktemp("ckpt")
    proc = run(
        "fairseq-train", data_bin, "--user-dir", USER_DIR, "--arch", "realformer_transformer",
        "--residual-attention-paths", "encoder,decoder,cross", "--residual-attention-mode", "mean",
        "--max-update", 30, "--save-dir", save, *TINY_FLAGS,
    )
    return save, proc


def test_train_writes_checkpoints_with_residual_settings(trained):
    save, proc = trained
    assert "RealFormerTransformerModel" in proc.stderr + proc.stdout
    ckpt = save / "checkpoint_last.pt"
    assert ckpt.exists() and (save / "checkpoint_best.pt").exists()
    state = torch.load(ckpt)  # weights_only: works because the plugin allow-lists fairseq's types
    model_cfg = state["cfg"]["model"]
    assert model_cfg.residual_attention_paths == "encoder,decoder,cross"
    assert model_cfg.residual_attention_mode == "mean"
    assert state["optimizer_history"][-1]["num_updates"] == 30


def test_generate_scores_with_sacrebleu(data_bin, trained):
    save, _ = trained
    proc = run(
        "fairseq-generate", data_bin, "--user-dir", USER_DIR, "--path", save / "checkpoint_best.pt",
        "--gen-subset", "test", "--beam", 3, "--scoring", "sacrebleu", "--cpu", "--batch-size", 16,
    )
    hyps = [line for line in proc.stdout.splitlines() if line.startswith("H-")]
    assert len(hyps) == 40
    bleu_line = [line for line in proc.stdout.splitlines() if "BLEU" in line]
    assert bleu_line and "BLEU = " in bleu_line[-1]
    float(bleu_line[-1].split("BLEU = ")[1].split()[0])


def test_generate_print_alignment_and_nbest(data_bin, trained):
    save, _ = trained
    proc = run(
        "fairseq-generate", data_bin, "--user-dir", USER_DIR, "--path", save / "checkpoint_best.pt",
        "--gen-subset", "valid", "--beam", 4, "--nbest", 2, "--print-alignment", "--cpu",
        "--max-sentences", 8,
    )
    assert sum(line.startswith("A-") for line in proc.stdout.splitlines()) == 80


def test_interactive_translates_stdin(data_bin, trained):
    save, _ = trained
    proc = run(
        "fairseq-interactive", data_bin, "--user-dir", USER_DIR, "--path", save / "checkpoint_best.pt",
        "--source-lang", "src", "--target-lang", "tgt", "--beam", 2, "--cpu",
        input="a b c\nj i h g\n",
    )
    assert sum(line.startswith("H-") for line in proc.stdout.splitlines()) == 2


def test_layerdrop_trains_and_generates(data_bin, tmp_path):
    run(
        "fairseq-train", data_bin, "--user-dir", USER_DIR, "--arch", "realformer_transformer",
        "--encoder-layerdrop", 0.5, "--decoder-layerdrop", 0.5, "--max-update", 10,
        "--save-dir", tmp_path, *TINY_FLAGS,
    )
    proc = run(
        "fairseq-generate", data_bin, "--user-dir", USER_DIR, "--path", tmp_path / "checkpoint_last.pt",
        "--gen-subset", "valid", "--beam", 2, "--cpu",
        "--model-overrides", "{'encoder_layers_to_keep': '1', 'decoder_layers_to_keep': '0'}",
    )
    assert sum(line.startswith("H-") for line in proc.stdout.splitlines()) == 40


def test_finetune_realformer_from_vanilla_transformer_checkpoint(data_bin, tmp_path):
    vanilla = tmp_path / "vanilla"
    run("fairseq-train", data_bin, "--arch", "transformer", "--user-dir", USER_DIR,
        "--max-update", 10, "--save-dir", vanilla, *TINY_FLAGS)
    warm = tmp_path / "warm"
    proc = run(
        "fairseq-train", data_bin, "--user-dir", USER_DIR, "--arch", "realformer_transformer",
        "--finetune-from-model", vanilla / "checkpoint_last.pt", "--max-update", 5,
        "--save-dir", warm, *TINY_FLAGS,
    )
    log = proc.stdout + proc.stderr
    assert "loading pretrained model from" in log
    vanilla_state = torch.load(vanilla / "checkpoint_last.pt")["model"]
    warm_state = torch.load(warm / "checkpoint_last.pt")["model"]
    assert set(vanilla_state) == set(warm_state)


@pytest.mark.parametrize(
    "flags,expected",
    [
        (["--residual-attention-paths", "encoder,foo"], ["--residual-attention-paths", "'foo'"]),
        (["--residual-attention-paths", ""], ["--residual-attention-paths", "empty"]),
        (["--residual-attention-mode", "max"], ["--residual-attention-mode", "'max'"]),
        (["--residual-attention-paths", "cross", "--no-cross-attention"], ["cross", "--no-cross-attention"]),
        (["--cross-self-attention"], ["--cross-self-attention"]),
    ],
    ids=["unknown-path", "empty-paths", "unknown-mode", "cross-without-cross-attention", "cross-self-attention"],
)
def test_bad_flags_fail_with_one_clear_line(data_bin, tmp_path, flags, expected):
    proc = run(
        "fairseq-train", data_bin, "--user-dir", USER_DIR, "--arch", "realformer_transformer",
        "--max-update", 1, "--save-dir", tmp_path, *TINY_FLAGS, *flags, check=False,
    )
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    error_lines = [line for line in proc.stderr.splitlines() if "error" in line.lower()]
    assert error_lines, proc.stderr[-2000:]
    for word in expected:
        assert word in error_lines[-1], error_lines[-1]
    assert not list(tmp_path.glob("*.pt"))
