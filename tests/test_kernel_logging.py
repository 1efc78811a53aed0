"""What the attention modules say about their kernels is said once per model, not once per
process: no module-global "once" state, so a second model in the same process (a second
training, fairseq's own tests) says the same lines again."""

import logging

import pytest
from conftest import USER_DIR, batch, build, make_dictionary

from realformer_nmt.modules.residual_attention import ResidualMultiheadAttention

OURS = "realformer_nmt"


def _ours(caplog):
    return [r.getMessage() for r in caplog.records if r.name.startswith(OURS)]


def test_each_model_says_its_kernel_choices_once(caplog):
    d = make_dictionary()
    src, lengths, tgt = batch(d)
    said = []
    for _ in range(2):  # two models, each run twice
        model = build(dictionary=d, residual_attention_paths="encoder,decoder,cross").train()
        caplog.clear()
        with caplog.at_level(logging.INFO, logger=OURS):
            model(src, lengths, tgt)
            first = _ours(caplog)
            model(src, lengths, tgt)
        said.append(first)
        assert _ours(caplog) == first  # the second forward says nothing new
    assert said[0] == said[1] and said[0]
    assert len(said[0]) == 1, said[0]  # one line for the model: encoder, decoder and cross paths together
    kinds = {m.notes for m in build(dictionary=d).modules() if isinstance(m, ResidualMultiheadAttention)}
    assert len(kinds) == 1  # one KernelNotes for the model's modules


def _train_in_process(data_bin, save_dir):
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq_cli.train import main

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, input_args=[
        str(data_bin), "--user-dir", USER_DIR, "--arch", "realformer_transformer", "--encoder-layers", "2",
        "--decoder-layers", "2", "--encoder-embed-dim", "16", "--decoder-embed-dim", "16",
        "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32", "--encoder-attention-heads", "2",
        "--decoder-attention-heads", "2", "--optimizer", "adam", "--lr", "1e-3", "--max-tokens", "2000", "--cpu",
        "--max-update", "3", "--save-dir", str(save_dir), "--no-save", "--no-progress-bar", "--seed", "1",
        "--num-workers", "0"])
    main(convert_namespace_to_omegaconf(args))


@pytest.mark.slow
def test_two_trainings_in_one_process_log_the_same_records(data_bin, tmp_path, caplog):
    """fairseq's own ``test_activation_checkpointing_does_not_change_metrics`` trains twice in
    one process and compares what was logged: with the kernel lines said once per process
    the second training logged four records fewer (44 against 48)."""
    counts = []
    for run in range(2):
        caplog.clear()
        with caplog.at_level(logging.INFO):
            _train_in_process(data_bin, tmp_path / f"run{run}")
        # (fairseq's own "--user-dir ... has already been imported" comes once per process: not counted)
        records = [r for r in caplog.records if "has already been imported" not in r.getMessage()]
        counts.append((len(records), len(_ours(caplog))))
    assert counts[0] == counts[1] and counts[0][1] > 0, counts
