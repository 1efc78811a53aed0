"""The bf16 fixes reach only what asks for it: importing the plugin must not change the
numerics of a command or a model that did not ask for bf16 on its own command line.

* ``prepare_for_inference_`` casts to bfloat16 only inside fairseq's inference commands
  whose command line has ``--bf16`` (and says so in one log line);
* a checkpoint's stored training config never casts: a vanilla ``transformer`` trained
  with ``--cpu --bf16`` loads in float32 through the hub with the plugin imported, and
  translates exactly as with fairseq's own code;
* turning ``--tpu`` off for ``--bf16`` is logged.
"""

import logging

import pytest
import torch
from cli_helpers import TINY_FLAGS
from conftest import USER_DIR, build, trains
from fairseq import options
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.models.transformer import TransformerModel
from inprocess import run_in_process

from realformer_tools.fairseq_fixes import bf16_decoding, bf16_without_tpu


@pytest.fixture(scope="module", autouse=True)
def bf16_decoding_fix():
    """The fix under test, as the launcher's ``--bf16-decoding`` installs it (with the always-on
    fixes: checkpoints load on torch >= 2.6, --bf16 without a TPU), for this module's tests only."""
    from realformer_tools.launch import fixes_installed

    with fixes_installed(bf16_decoding=True, quiet=True, ranks=False):
        yield


def inference_cfg(*flags):
    parser = options.get_generation_parser()
    args = options.parse_args_and_arch(parser, input_args=["/nonexistent", "--path", "x.pt", *flags])
    return convert_namespace_to_omegaconf(args)


def test_a_bf16_config_outside_an_inference_command_never_casts():
    model = build()
    model.prepare_for_inference_(inference_cfg("--cpu", "--bf16"))
    assert {p.dtype for p in model.parameters()} == {torch.float32}


@pytest.mark.parametrize("flags,dtype", [(("--bf16",), torch.bfloat16), ((), torch.float32)])
def test_an_inference_command_casts_only_for_its_own_bf16_flag(caplog, flags, dtype):
    cfg = inference_cfg("--cpu", *flags)
    model = build()

    def main(cfg):  # what fairseq-generate's main does with its models
        model.prepare_for_inference_(cfg)

    with caplog.at_level(logging.INFO, logger=bf16_decoding.__name__):
        bf16_decoding.notes_bf16_command_line(main)(cfg)
    assert {p.dtype for p in model.parameters()} == {dtype}
    casts = [r for r in caplog.records if "casting" in r.getMessage()]
    assert len(casts) == (1 if dtype == torch.bfloat16 else 0)


@pytest.mark.parametrize("command", ["generate", "interactive", "eval_lm"])
def test_fairseqs_inference_commands_carry_the_wrapper_and_training_does_not(command):
    """fairseq-generate, -interactive and -eval-lm reach ``main`` through their module's
    global (``cli_main`` -> ``call_main(cfg, main)``), so the wrapped one is what runs."""
    import importlib

    module = importlib.import_module(f"fairseq_cli.{command}")
    assert getattr(module.main, "__realformer_fixed__", False)
    assert module.main.__wrapped__.__module__ == f"fairseq_cli.{command}"
    assert module.main.__code__.co_qualname == BF16_WRAPPER  # (functools.wraps copies __qualname__)
    # fairseq-train's main may carry other fixes (train_preflight), never the bf16 inference wrapper
    main, layers = importlib.import_module("fairseq_cli.train").main, []
    while main is not None:
        layers.append(main.__code__.co_qualname)
        main = getattr(main, "__wrapped__", None)
    assert BF16_WRAPPER not in layers and layers[-1] == "main", layers


BF16_WRAPPER = "notes_bf16_command_line.<locals>.wrapper"


def test_turning_tpu_off_for_bf16_is_logged(caplog):
    parser = options.get_training_parser()
    with caplog.at_level(logging.INFO, logger=bf16_without_tpu.__name__):
        args = options.parse_args_and_arch(parser, input_args=["/nonexistent", "--arch", "transformer",
                                                               "--cpu", "--bf16"])
    assert not args.tpu
    assert sum("--bf16 without a TPU" in r.getMessage() for r in caplog.records) == 1


@pytest.fixture(scope="module")
@trains
def vanilla_bf16_checkpoint(data_bin, tmp_path_factory):
    save = tmp_path_factory.mktemp("vanilla_bf16")
    run_in_process("fairseq-train", data_bin, "--user-dir", USER_DIR, "--arch", "transformer", *TINY_FLAGS,
                   "--max-update", 10, "--save-dir", save, "--bf16")  # (tests/inprocess.py)
    return save


@pytest.mark.slow
def test_vanilla_checkpoint_trained_with_bf16_loads_in_float32_through_the_hub(data_bin, vanilla_bf16_checkpoint):
    hub = TransformerModel.from_pretrained(str(vanilla_bf16_checkpoint), "checkpoint_last.pt",
                                           data_name_or_path=str(data_bin))
    assert hub.cfg.common.bf16  # it was trained with --bf16 ...
    assert {p.dtype for p in hub.parameters()} == {torch.float32}  # ... and loads as the user asked: float32
    sentences = ["a b c d", "e f g"]
    ours = hub.translate(sentences, beam=2)
    bf16_decoding.uninstall()  # fairseq's own code, for the same weights
    try:
        theirs = TransformerModel.from_pretrained(str(vanilla_bf16_checkpoint), "checkpoint_last.pt",
                                                  data_name_or_path=str(data_bin))
        assert {p.dtype for p in theirs.parameters()} == {torch.float32}
        assert theirs.translate(sentences, beam=2) == ours
    finally:
        bf16_decoding.install()
