"""realformer_bert: fairseq's RoBERTa with the RealFormer encoder (architectures, parity
with ``roberta``, the paper's formula, defaults and errors)."""

import argparse

import pytest
import torch
from bert_helpers import bert_batch, bert_dictionary, build_bert, reference_features, sharpen_attention
from fairseq.models import ARCH_CONFIG_REGISTRY

from realformer_nmt.errors import ConfigError, FlagValueError
from realformer_nmt.models.realformer_bert import RealFormerBertModel

# He et al. (2021), Table 1: layers, hidden size, attention heads, intermediate size
PAPER_TABLE_1 = {
    "realformer_bert_small": (4, 512, 8, 2048),
    "realformer_bert_base": (12, 768, 12, 3072),
    "realformer_bert_large": (24, 1024, 16, 4096),
    "realformer_bert_xlarge": (36, 1536, 24, 6144),
}


def arch_args(arch, **given):
    args = argparse.Namespace(**given)
    ARCH_CONFIG_REGISTRY[arch](args)
    return args


@pytest.mark.parametrize("arch", sorted(PAPER_TABLE_1))
def test_architectures_have_the_papers_dims_and_bert_defaults(arch):
    args = arch_args(arch)
    dims = (args.encoder_layers, args.encoder_embed_dim, args.encoder_attention_heads, args.encoder_ffn_embed_dim)
    assert dims == PAPER_TABLE_1[arch]
    assert args.activation_fn == "gelu" and not args.encoder_normalize_before  # GELU, Post-LN
    assert args.dropout == 0.1 and args.attention_dropout == 0.1
    assert args.encoder_learned_pos and args.max_source_positions == 512
    assert args.residual_attention_paths == "encoder"
    assert args.residual_attention_mode == ("mean" if dims[0] > 24 else "sum")


def test_small_arch_builds_the_papers_shapes():
    model = build_bert("realformer_bert_small", tiny=False)
    layers = model.encoder.sentence_encoder.layers
    assert len(layers) == 4
    assert layers[0].self_attn.num_heads == 8 and layers[0].self_attn.embed_dim == 512
    assert tuple(layers[0].fc1.weight.shape) == (2048, 512)
    assert model.encoder.sentence_encoder.embed_positions.weight.shape[0] == 512 + 2  # + pad offset
    assert all(layer.self_attn.residual for layer in layers)


@pytest.mark.parametrize("layers, mode", [(24, "sum"), (25, "mean")])
def test_mean_is_the_default_deeper_than_24_layers(layers, mode):
    assert arch_args("realformer_bert_base", encoder_layers=layers).residual_attention_mode == mode
    model = build_bert(encoder_layers=layers, encoder_embed_dim=8, encoder_ffn_embed_dim=8, encoder_attention_heads=2)
    assert model.residual.mode == mode
    assert {layer.self_attn.mode for layer in model.encoder.sentence_encoder.layers} == {mode}


def test_mode_flag_overrides_the_depth_default():
    assert arch_args("realformer_bert_xlarge", residual_attention_mode="sum").residual_attention_mode == "sum"
    assert arch_args("realformer_bert_small", residual_attention_mode="mean").residual_attention_mode == "mean"


@pytest.mark.parametrize("pre_ln", [False, True])
def test_paths_none_equals_fairseq_roberta(pre_ln):
    d = bert_dictionary()
    roberta = sharpen_attention(build_bert("roberta", d, seed=1, encoder_normalize_before=pre_ln))
    ours = build_bert("realformer_bert", d, seed=2, encoder_normalize_before=pre_ln,
                      residual_attention_paths="none")
    assert list(ours.state_dict()) == list(roberta.state_dict())
    ours.load_state_dict(roberta.state_dict())  # strict
    tokens = bert_batch(d)
    (theirs, t_extra), (mine, m_extra) = (m(tokens, return_all_hiddens=True) for m in (roberta, ours))
    torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=1e-5)
    for a, b in zip(m_extra["inner_states"], t_extra["inner_states"], strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)

    # and the same gradients in a training step
    for model in (roberta, ours):
        model.train()
        torch.manual_seed(3)
        model(tokens)[0].log_softmax(-1)[..., 5].sum().backward()
    for (name, a), (_, b) in zip(ours.named_parameters(), roberta.named_parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_roberta_loads_realformer_bert_weights():
    d = bert_dictionary()
    ours = build_bert("realformer_bert", d, seed=4)
    roberta = build_bert("roberta", d, seed=5)
    roberta.load_state_dict(ours.state_dict())  # strict: the same parameter names
    assert set(roberta.state_dict()) == set(ours.state_dict())


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_features_match_the_papers_formula(mode):
    d = bert_dictionary()
    model = sharpen_attention(build_bert(dictionary=d, seed=6, residual_attention_mode=mode))
    tokens = bert_batch(d, bsz=3, length=10)
    features, _ = model(tokens, features_only=True)
    expected = reference_features(model, tokens, paths={"encoder"}, mode=mode)
    keep = tokens.ne(d.pad())
    torch.testing.assert_close(features[keep], expected[keep], atol=1e-5, rtol=1e-5)


def test_reference_reproduces_fairseq_roberta():
    """The plain reference is right for the vanilla model too (no residual path)."""
    d = bert_dictionary()
    roberta = sharpen_attention(build_bert("roberta", d, seed=7))
    tokens = bert_batch(d)
    features, _ = roberta(tokens, features_only=True)
    keep = tokens.ne(d.pad())
    torch.testing.assert_close(features[keep], reference_features(roberta, tokens, set(), "sum")[keep],
                               atol=1e-5, rtol=1e-5)


def test_residual_path_changes_the_output():
    d = bert_dictionary()
    real = sharpen_attention(build_bert(dictionary=d, seed=8))
    vanilla = build_bert(dictionary=d, seed=9, residual_attention_paths="none")
    vanilla.load_state_dict(real.state_dict())
    tokens = bert_batch(d)
    mean = build_bert(dictionary=d, seed=9, residual_attention_mode="mean")
    mean.load_state_dict(real.state_dict())
    features = {name: m(tokens, features_only=True)[0] for name, m in
                [("sum", real), ("none", vanilla), ("mean", mean)]}
    assert (features["sum"] - features["none"]).abs().max() > 0.1
    assert (features["sum"] - features["mean"]).abs().max() > 0.1


@pytest.mark.parametrize("paths", ["decoder", "encoder,cross"])
def test_paths_the_encoder_lacks_are_one_clear_error(paths):
    with pytest.raises(ConfigError, match=r"--residual-attention-paths.*only encoder"):
        build_bert(residual_attention_paths=paths)


def test_flags_are_registered_and_validated_by_argparse(capsys):
    parser = argparse.ArgumentParser()
    RealFormerBertModel.add_args(parser)
    args = parser.parse_args(["--residual-attention-paths", "none", "--residual-attention-mode", "mean"])
    assert (args.residual_attention_paths, args.residual_attention_mode) == ("none", "mean")
    paths_help = next(a.help for a in parser._actions if a.dest == "residual_attention_paths")
    assert "encoder (self-attention)" in paths_help and "decoder" not in paths_help
    # with the launcher's fixes (its one-line error hook), not argparse's SystemExit (which prints
    # the host tool's whole usage first): the one-line error the CLIs print (tests/test_error_lines.py)
    from realformer_tools.launch import fixes_installed

    with fixes_installed(quiet=True, ranks=False), \
            pytest.raises(FlagValueError, match="--residual-attention-paths: unknown path 'sideways'"):
        parser.parse_args(["--residual-attention-paths", "sideways"])
    assert "usage:" not in capsys.readouterr().err


def test_classification_heads_work_as_in_roberta():
    d = bert_dictionary()
    model = build_bert(dictionary=d)
    model.register_classification_head("sentiment", num_classes=3)
    tokens = bert_batch(d)
    logits, _ = model(tokens, classification_head_name="sentiment")
    assert logits.shape == (tokens.size(0), 3)
    features, _ = model(tokens, features_only=True)
    torch.testing.assert_close(logits, model.classification_heads["sentiment"](features))
    assert RealFormerBertModel.hub_models() == {}  # never RoBERTa's download links
