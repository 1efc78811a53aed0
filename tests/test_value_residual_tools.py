"""Value residual around the model: its flags (parsing, one-sentence refusals), checkpoints (the note,
loading across settings), the Hugging Face export's refusal, and the study's harness
(scripts/compare_backbones.py): the two backbones (Pre-LN with value residual on the encoder and
decoder self-attention, without and with residual scores), their family of seed-paired comparisons
with intervals corrected for it, and a tiny run of the study's command in which only they train and
are decoded on the three test sets. The model itself: test_value_residual.py."""

import argparse
import json
import shutil
import statistics

import pytest
import torch
from bert_helpers import build_bert
from conftest import USER_DIR, build, make_dictionary
from fairseq import options
from harness_helpers import tiny_recipe
from test_value_residual import ALL, padded_batch, value_model

from realformer_nmt import residual_config
from realformer_nmt.errors import ConfigError

pytest_plugins = ("harness_fixtures",)  # m30k_three_sets: the Multi30k slice with three test sets


# --------------------------------------------------------------------------------------
# flags, checkpoints, export
# --------------------------------------------------------------------------------------

def test_flags_parse_and_bad_values_are_one_sentence():
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, ["data", "--task", "translation", "--user-dir", USER_DIR, "--arch",
                                                "realformer_transformer", "--value-residual-paths", "cross,encoder",
                                                "--value-residual-mix", "half"])
    settings = residual_config.resolve(args)
    assert args.value_residual_paths == "encoder,cross" and settings.value_paths == {"encoder", "cross"}
    assert settings.value_mix == "half" and settings.paths == {"encoder", "decoder", "cross"}
    defaults = options.parse_args_and_arch(options.get_training_parser(), [
        "data", "--task", "translation", "--user-dir", USER_DIR, "--arch", "realformer_transformer"])
    assert residual_config.resolve(defaults).value_paths == frozenset()
    assert (defaults.value_residual_paths, defaults.value_residual_mix) == ("none", "learned")
    cases = {"--value-residual-paths: unknown path 'values'": dict(value_residual_paths="values"),
             "--value-residual-paths: 'none' cannot be combined": dict(value_residual_paths="none,cross"),
             "--value-residual-mix: unknown mix 'third'": dict(value_residual_mix="third"),
             "--value-residual-paths includes 'cross' but --no-cross-attention": dict(
                 residual_attention_paths="encoder,decoder", value_residual_paths="cross", no_cross_attention=True)}
    for message, cfg in cases.items():
        with pytest.raises(ConfigError) as error:
            residual_config.resolve(argparse_namespace(**cfg))
        assert str(error.value).startswith(message) and "\n" not in str(error.value)
    with pytest.raises(ConfigError, match="--value-residual-paths includes decoder but this model has only encoder"):
        build_bert(value_residual_paths="decoder")


def argparse_namespace(**kwargs):
    return argparse.Namespace(**kwargs)


def test_checkpoints_note_the_setting_and_load_across_settings(caplog):
    """The state dict notes value residual (none: today's note); loading weights trained with another
    setting warns naming it; a checkpoint without λ (no value residual, or half) starts a
    learned model at the half mix (a warm start), and a learned one loads into half without them."""
    d = make_dictionary()
    learned, half, plain = (build(dictionary=d, value_residual_paths=paths, value_residual_mix=mix)
                            for paths, mix in ((ALL, "learned"), ("encoder,decoder", "half"), ("none", "half")))
    note = residual_config.CHECKPOINT_NOTE
    assert learned.state_dict()._metadata[""][note] == f"{ALL};sum;{ALL};learned"
    assert plain.state_dict()._metadata[""][note] == f"{ALL};sum"
    noted = residual_config.noted_settings(learned.state_dict())
    assert (noted.value_paths, noted.value_mix) == ({"encoder", "decoder", "cross"}, "learned")
    assert residual_config.noted_settings(plain.state_dict()).value_paths == frozenset()
    with caplog.at_level("WARNING"):
        learned.load_state_dict(plain.state_dict())
    assert "value residual paths none -> encoder,decoder,cross" in caplog.text
    assert all(p.tolist() == 0.5 for n, p in learned.named_parameters() if "value_residual" in n)
    caplog.clear()
    src, lengths, tgt = padded_batch(d)
    with caplog.at_level("WARNING"):
        half.load_state_dict(value_model(d, "encoder,decoder", "learned").state_dict())
    assert "value residual mix learned -> half" in caplog.text


def test_hf_export_refuses_value_residual_in_one_line():
    """The exported modeling code has no value residual: the export refuses the checkpoint in one
    sentence naming the flag (before anything is written)."""
    from realformer_tools.hf.hf_weights import hf_config_values

    with pytest.raises(ConfigError) as error:
        hf_config_values(build_bert(value_residual_paths="encoder", value_residual_mix="half"))
    message = str(error.value)
    assert "\n" not in message and "does not implement --value-residual-paths encoder" in message
    assert hf_config_values(build_bert())["residual_attention"] is True  # today's models still export


def test_the_harness_backbones_are_pre_ln_with_value_residual():
    from realformer_tools.experiments.translation import recipe

    def flags(name):
        return " ".join(recipe.backbone_flags(name))

    assert flags("preln_vr") == ("--arch realformer_transformer --residual-attention-paths none --value-residual-paths "
                                 "encoder,decoder --value-residual-mix learned --encoder-normalize-before "
                                 "--decoder-normalize-before")
    assert flags("realformer_preln_vr") == flags("realformer_preln").replace(
        " --encoder-normalize-before", " --value-residual-paths encoder,decoder --value-residual-mix learned "
        "--encoder-normalize-before")
    for name in ("preln_vr", "realformer_preln_vr"):
        assert name in recipe.VARIANTS and name in recipe.MAIN_ORDER and name in recipe.BACKBONE_DESCRIPTIONS
        assert "learned mix" in recipe.BACKBONE_DESCRIPTIONS[name]
    from realformer_tools.cli import compare_backbones
    from realformer_tools.experiments.translation.figures import COLORS

    assert compare_backbones.VARIANTS == recipe.VARIANTS and set(recipe.VARIANTS) <= set(COLORS)


def test_the_family_of_comparisons_is_corrected_and_reported(m30k_three_sets, tmp_path):
    """Pre-LN and RealFormer on Pre-LN from a results file, the two value residual backbones run here
    (finished runs laid out as the harness leaves them): each new backbone minus Pre-LN and minus
    RealFormer on Pre-LN and the two against each other, seed-paired on every test set, over the sets
    and for the best valid loss, each interval also corrected for the family (5 pairs x 3 sets = 15 on a
    set, 5 over the sets and for the loss); the Markdown gives the table; a re-render changes nothing."""
    from scipy.stats import t
    from test_import_results import SETS, _fake_finished, _quiet

    from realformer_tools.experiments import compare
    from realformer_tools.experiments.translation import rerender
    from realformer_tools.experiments.translation.summary import summary_rows

    data, old, new = m30k_three_sets, tmp_path / "old", tmp_path / "new"
    seeds = (1, 2, 3, 4)
    base = {"preln": 29.0, "realformer_preln": 29.4, "preln_vr": 29.8, "realformer_preln_vr": 30.5}
    for b, bleu in base.items():
        for seed in seeds:
            noise = [0.07 * ((seed * len(b) + i) % 5) for i in range(3)]  # differs by backbone and seed
            by_set = tuple(round(bleu - 4 * i + 0.1 * seed * (i + 1) + noise[i], 2) for i in range(3))
            _fake_finished(data, old if b in ("preln", "realformer_preln") else new, b, seed, by_set[0],
                           round(5.0 - 0.01 * seed - 0.003 * ((seed * len(b)) % 4), 4), by_set, seconds=100.0 + seed)
    committed = tmp_path / "results" / "m30k.json"
    compare.compare(str(data), str(old), tiny_recipe(), backbones=("preln", "realformer_preln"), seeds=seeds,
                    results_path=str(committed), report_only=True, log=_quiet)
    results = tmp_path / "results" / "vr.json"
    (results.parent / "summary.png").write_bytes(b"")  # a results/ folder: summary.png drawn again with the study
    summary = compare.compare(str(data), str(new), tiny_recipe(), backbones=tuple(base), seeds=seeds,
                              results_path=str(results), report_only=True, import_from=str(committed), log=_quiet)
    assert summary["preln"]["imported_from_per_seed"] == [str(committed)] * 4
    assert "imported_from_per_seed" not in summary["preln_vr"]
    pairs = {("preln_vr", "preln"), ("realformer_preln_vr", "preln"), ("preln_vr", "realformer_preln"),
             ("realformer_preln_vr", "realformer_preln"), ("realformer_preln_vr", "preln_vr")}
    for b, ref in pairs:
        e = summary[b]
        by_set = e[f"seed_paired_vs_{ref}_by_test_set"]
        assert list(by_set) == list(SETS)
        for name, record in by_set.items():
            mine = e["bleu_per_seed_by_test_set"][name]
            theirs = summary[ref]["bleu_per_seed_by_test_set"][name]
            assert record["per_seed"] == pytest.approx([a - c for a, c in zip(mine, theirs)], abs=1e-9)
            diffs = record["per_seed"]
            half = t.ppf(1 - 0.025 / 15, 3) * statistics.stdev(diffs) / 2
            assert record["corrected_for"] == 15
            assert record["ci95_corrected"] == pytest.approx([statistics.mean(diffs) - half,
                                                              statistics.mean(diffs) + half], abs=0.006)
            assert record["ci95_corrected"][0] < record["ci95"][0]
        assert e[f"seed_paired_vs_{ref}"]["ci95_corrected"] == by_set[SETS[0]]["ci95_corrected"]
        assert e[f"seed_paired_vs_{ref}_over_test_sets"]["corrected_for"] == 5
        loss = e[f"seed_paired_valid_loss_vs_{ref}"]
        assert loss["corrected_for"] == 5 and loss["per_seed"] == pytest.approx(
            [a - c for a, c in zip(e["valid_loss_per_seed"], summary[ref]["valid_loss_per_seed"])], abs=1e-9)
    assert "ci95_corrected" not in summary["realformer_preln"]["seed_paired_vs_preln"]  # not of the family
    assert [t["seed"] for t in summary["preln_vr"]["paired_vs_preln"]] == list(seeds)  # bootstrap per seed
    md = results.with_suffix(".md").read_text()
    assert "**Value residual: 5 seed-paired comparisons as one family**" in md
    assert "5 pairs x 3 test sets = 15 BLEU comparisons on each set" in md
    for b, ref in pairs:
        assert f"| {b} − {ref} |" in md
    assert "corrected for 15 comparisons" in md and "corrected for 5 comparisons" in md
    copy = tmp_path / "copy" / "vr.json"
    copy.parent.mkdir()
    copy.write_text(results.read_text())
    rerender.rerender(str(copy), plot=False, log=_quiet)
    assert json.loads(copy.read_text()) == json.loads(results.read_text())
    assert copy.with_suffix(".md").read_text() == md
    # summary.png: each new backbone minus Pre-LN in the right column, per set and over the sets
    assert (results.parent / "summary.png").read_bytes()[:4] == b"\x89PNG"
    rows = {r["variant"]: r for r in summary_rows(str(results.parent)) if r.get("one_column")}
    assert list(rows) == [f"{name}, {where}" for name in ("value residual", "RealFormer + value residual")
                          for where in [f"on {n}" for n in SETS] + ["mean of the test sets"]]
    flickr = rows["value residual, on test_2016_flickr"]["cells"]
    assert flickr[0] is None and flickr[1]["family"] == 15 and flickr[1]["mean"] == summary["preln_vr"][
        "seed_paired_vs_preln"]["mean"]
    assert rows["RealFormer + value residual, mean of the test sets"]["cells"][1]["family"] == 5


@pytest.mark.slow
def test_the_two_backbones_train_and_decode_and_only_they_train(m30k_three_sets, tmp_path):
    """The study's command on a tiny recipe: Pre-LN and RealFormer on Pre-LN come from a results file,
    only preln_vr and realformer_preln_vr train (value residual in their checkpoints) and are decoded and
    scored on the three test sets. The file's two runs are finished runs laid out as the harness leaves
    them (scored on the three sets, as in the family test above): the harness reads only their records
    and hypotheses, so training and decoding them (2 trainings, 6 decodings) proved nothing here."""
    from test_import_results import _fake_finished, _quiet

    from realformer_tools.experiments import compare

    data = tmp_path / "data"
    shutil.copytree(m30k_three_sets, data / m30k_three_sets.name)
    data = data / m30k_three_sets.name
    committed = tmp_path / "results" / "m30k.json"
    for b, bleu in (("preln", 29.0), ("realformer_preln", 29.4)):
        _fake_finished(data, tmp_path / "old", b, 1, bleu, 5.0, (bleu, bleu - 4, bleu - 8))
    compare.compare(str(data), str(tmp_path / "old"), tiny_recipe(), backbones=("preln", "realformer_preln"),
                    seeds=(1,), results_path=str(committed), report_only=True, log=_quiet)
    assert len(json.loads(committed.read_text())["preln"]["bleu_per_seed_by_test_set"]) == 3
    messages, out = [], tmp_path / "new"
    summary = compare.compare(str(data), str(out), tiny_recipe(),
                              backbones=("preln", "realformer_preln", "preln_vr", "realformer_preln_vr"), seeds=(1,),
                              results_path=str(tmp_path / "results" / "vr.json"), threads=1, log=messages.append,
                              jobs=2, import_from=str(committed))
    trained = sorted(p.parent.parent.name for p in out.glob("*/seed1/checkpoint_best.pt"))
    assert trained == ["preln_vr", "realformer_preln_vr"]
    for b in ("preln_vr", "realformer_preln_vr"):
        e = summary[b]
        assert e["fairseq_status_per_seed"] == ["finished"] and e["flags"] == compare.backbone_flags(b)
        assert all(v[0] is not None for v in e["bleu_per_seed_by_test_set"].values())
        assert len(e["bleu_per_seed_by_test_set"]) == 3
        state = torch.load(out / b / "seed1" / "checkpoint_best.pt", map_location="cpu", weights_only=False)
        lambdas = [k for k in state["model"] if k.endswith("value_residual.lamb")]
        assert lambdas == ["encoder.layers.1.self_attn.value_residual.lamb",
                           "decoder.layers.1.self_attn.value_residual.lamb"]  # 2+2 layers: layer 2 mixes
        assert any(state["model"][k].item() != 0.5 for k in lambdas)  # learned
    assert summary["preln"]["imported_from_per_seed"] == [str(committed)]
