"""Through fairseq's real command-line tools: preprocess -> train -> generate.

Every command that reads or prints what is checked runs in a process of its own; the
trainings that only make a checkpoint for one (the layerdrop model, the vanilla model and its
warm start) run the same command lines through the launcher's ``main`` in the test process
(``inprocess.run_in_process``)."""

import pytest
from cli_helpers import TINY_FLAGS, load_checkpoint, run
from conftest import USER_DIR
from inprocess import run_in_process

# fairseq's own checkpoint loaders run in this process: with the fixes (torch >= 2.6)
pytestmark = pytest.mark.usefixtures("fairseq_fixes")


def test_train_writes_checkpoints_with_residual_settings(trained):
    save, proc = trained
    assert "RealFormerTransformerModel" in proc.stderr + proc.stdout
    ckpt = save / "checkpoint_last.pt"
    assert ckpt.exists() and (save / "checkpoint_best.pt").exists()
    state = load_checkpoint(ckpt)
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


@pytest.mark.slow
def test_layerdrop_trains_and_generates(data_bin, tmp_path):
    """Layerdrop training in mean mode, then a pruned model (the running mean over the
    layers kept is tested exactly in test_fidelity_options.py)."""
    run_in_process(
        "fairseq-train", data_bin, "--user-dir", USER_DIR, "--arch", "realformer_transformer",
        "--residual-attention-mode", "mean", "--encoder-layerdrop", 0.5, "--decoder-layerdrop", 0.5, "--max-update", 10,
        "--save-dir", tmp_path, *TINY_FLAGS,
    )
    proc = run(
        "fairseq-generate", data_bin, "--user-dir", USER_DIR, "--path", tmp_path / "checkpoint_last.pt",
        "--gen-subset", "valid", "--beam", 2, "--cpu",
        "--model-overrides", "{'encoder_layers_to_keep': '1', 'decoder_layers_to_keep': '0'}",
    )
    assert sum(line.startswith("H-") for line in proc.stdout.splitlines()) == 40


WARM_UPDATES, LR = 5, 1e-3  # TINY_FLAGS: Adam, constant lr 1e-3


@pytest.mark.slow
def test_finetune_realformer_from_vanilla_transformer_checkpoint(data_bin, tmp_path):
    vanilla = tmp_path / "vanilla"
    # another seed than the warm run's (TINY_FLAGS: --seed 1), so that a RealFormer left at
    # its own initialisation would not start from the vanilla model's initial weights
    run_in_process("fairseq-train", data_bin, "--arch", "transformer", "--user-dir", USER_DIR,
                   "--max-update", 10, "--save-dir", vanilla, *TINY_FLAGS, "--seed", 2)
    warm = tmp_path / "warm"
    proc = run_in_process(
        "fairseq-train", data_bin, "--user-dir", USER_DIR, "--arch", "realformer_transformer",
        "--finetune-from-model", vanilla / "checkpoint_last.pt", "--max-update", WARM_UPDATES,
        "--save-dir", warm, *TINY_FLAGS,
    )
    log = proc.stdout + proc.stderr
    assert "loading pretrained model from" in log
    vanilla_state = load_checkpoint(vanilla / "checkpoint_last.pt")["model"]
    warm_state = load_checkpoint(warm / "checkpoint_last.pt")["model"]
    assert set(vanilla_state) == set(warm_state)
    # the warm start began from the vanilla weights: 5 Adam steps of lr 1e-3 move a weight
    # by at most ~5e-3 (an Adam step is about lr per weight), while another seed's
    # initialisation differs from the vanilla weights by ~0.1-1 in every matrix
    for name, weight in vanilla_state.items():
        assert (warm_state[name] - weight).abs().max() <= 2 * WARM_UPDATES * LR, name


def test_hub_interface_loads_and_translates(data_bin, trained):
    from realformer_nmt.models.realformer_transformer import RealFormerTransformerModel

    save, _ = trained
    hub = RealFormerTransformerModel.from_pretrained(
        str(save), checkpoint_file="checkpoint_last.pt", data_name_or_path=str(data_bin)

    )
    assert isinstance(hub.models[0], RealFormerTransformerModel)
    assert hub.models[0].encoder.residual.mode == "mean"
    out = hub.translate(["a b c", "d e"], beam=2)
    assert len(out) == 2 and all(isinstance(t, str) and t for t in out)
