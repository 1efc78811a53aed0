"""A pre-trained realformer_bert checkpoint fine-tunes with fairseq's RoBERTa recipe
(``--task sentence_prediction --restore-file ... --reset-*``, classification and
regression heads) and loads in fairseq's RoBERTa hub interface."""

import math
import shutil

import pytest
import torch
from bert_helpers import (
    TINY_BERT_FLAGS,
    USER_DIR,
    WIKITEXT2,
    finite,
    log_records,
    prepared_wikitext2,
    pretrained_nsp,
)
from conftest import require_shared_data, trains
from fairseq import checkpoint_utils
from fairseq.data import Dictionary, data_utils
from fairseq.models.roberta import RobertaHubInterface
from inprocess import run_in_process as run  # fairseq's tools in this process (tests/inprocess.py)

from realformer_nmt.models.realformer_bert import RealFormerBertModel

# fairseq's own checkpoint loaders run in this process: with the fixes (torch >= 2.6)
pytestmark = pytest.mark.usefixtures("fairseq_fixes")


def labelled_sentences(n_train=96, n_valid=32):
    """Short WikiText-2 sentences with a class (does it contain a digit?) and a
    regression target (its number of words / 10)."""
    require_shared_data(WIKITEXT2)
    sentences = []
    for line in (WIKITEXT2 / "valid.txt").read_text(encoding="utf-8").splitlines():
        line = " ".join(line.split())
        if not line or line.startswith("="):
            continue
        for sentence in line.split(" . "):
            words = sentence.split()
            if 5 <= len(words) <= 20 and "<unk>" not in words:
                sentences.append(" ".join(words) + " .")
    sentences = sentences[: n_train + n_valid]
    cls = [str(int(any(c.isdigit() for c in s))) for s in sentences]
    reg = [f"{len(s.split()) / 10:.1f}" for s in sentences]
    return {"train": slice(0, n_train), "valid": slice(n_train, n_train + n_valid)}, sentences, cls, reg


@pytest.fixture(scope="module")
@trains
def pretrained(tmp_path_factory):
    save, _ = pretrained_nsp(tmp_path_factory)
    return save / "checkpoint_last.pt"


@pytest.fixture(scope="module")
def labelled(tmp_path_factory):
    """{"cls": dir, "reg": dir, ...}: the labelled set binarized for sentence_prediction
    (input0/ with the pre-training dictionary; label/ binarized or as .label floats)."""
    import sentencepiece as spm

    data = prepared_wikitext2(tmp_path_factory)
    root = tmp_path_factory.mktemp("labelled")
    splits, sentences, cls, reg = labelled_sentences()
    sp = spm.SentencePieceProcessor(model_file=str(data / "spm.model"))
    raw = root / "raw"
    raw.mkdir()
    for split, rows in splits.items():
        pieces = (" ".join(sp.encode(s, out_type=str)) for s in sentences[rows])
        (raw / f"{split}.input0").write_text("\n".join(pieces) + "\n")
        (raw / f"{split}.label").write_text("\n".join(cls[rows]) + "\n")
    run("fairseq-preprocess", "--only-source", "--trainpref", raw / "train.input0", "--validpref",
        raw / "valid.input0", "--destdir", root / "cls" / "input0", "--srcdict", data / "dict.txt", "--workers", 1)
    run("fairseq-preprocess", "--only-source", "--trainpref", raw / "train.label", "--validpref",
        raw / "valid.label", "--destdir", root / "cls" / "label", "--workers", 1)
    shutil.copytree(root / "cls" / "input0", root / "reg" / "input0")
    (root / "reg" / "label").mkdir()
    for split, rows in splits.items():
        (root / "reg" / "label" / f"{split}.label").write_text("\n".join(reg[rows]) + "\n")
    return {"cls": root / "cls", "reg": root / "reg", "data": data, "sentences": sentences, "splits": splits,
            "cls_labels": cls, "reg_labels": reg}


def finetune(data_dir, pretrained, save_dir, *head_flags):
    """fairseq-train with RoBERTa's fine-tuning recipe (GLUE README), shrunk for CPU."""
    proc = run(
        "fairseq-train", data_dir, "--user-dir", USER_DIR, "--task", "sentence_prediction",
        "--restore-file", pretrained, "--reset-optimizer", "--reset-dataloader", "--reset-meters",
        "--arch", "realformer_bert_small", *TINY_BERT_FLAGS, "--seed", 7,
        "--init-token", 0, "--separator-token", 2, "--criterion", "sentence_prediction",
        "--max-positions", 512, "--batch-size", 8, "--required-batch-size-multiple", 1,
        "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--adam-eps", 1e-6, "--lr", 1e-4,
        "--max-update", 10, "--log-interval", 5, "--save-dir", save_dir, *head_flags,
    )
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def classifier(labelled, pretrained, tmp_path_factory):
    save = tmp_path_factory.mktemp("ft_cls")
    log = finetune(labelled["cls"], pretrained, save, "--num-classes", 2,
                   "--best-checkpoint-metric", "accuracy", "--maximize-best-checkpoint-metric")
    return save, log


@pytest.fixture(scope="module")
def regressor(labelled, pretrained, tmp_path_factory):
    save = tmp_path_factory.mktemp("ft_reg")
    log = finetune(labelled["reg"], pretrained, save, "--regression-target", "--num-classes", 1,
                   "--best-checkpoint-metric", "loss")
    return save, log


def _hub(save_dir, data_dir, spm_model):
    hub = RealFormerBertModel.from_pretrained(
        str(save_dir), checkpoint_file="checkpoint_last.pt", data_name_or_path=str(data_dir),
        bpe="sentencepiece", sentencepiece_model=str(spm_model),
    )
    return hub.eval()  # as for RoBERTa: the hub model starts in training mode (dropout on)


@pytest.mark.slow
def test_finetuning_restores_the_pretrained_encoder_and_adds_a_head(classifier, pretrained):
    save, log = classifier
    assert f"Loaded checkpoint {pretrained}" in log
    inner = log_records(log, "train_inner")
    assert [r["num_updates"] for r in inner] == [5, 10]  # counters reset by --reset-optimizer
    before = checkpoint_utils.load_checkpoint_to_cpu(str(pretrained))["model"]
    after = checkpoint_utils.load_checkpoint_to_cpu(str(save / "checkpoint_last.pt"))["model"]
    encoder = [k for k in before if k.startswith("encoder.")]
    # 10 Adam steps at lr 1e-4 from the pre-trained weights (a fresh init, seed 7 here,
    # would be ~0.1 away): restored, then trained
    drift = max((after[k].float() - before[k].float()).abs().max().item() for k in encoder)
    assert 0 < drift < 5e-3
    assert not any(k.startswith("classification_heads.next_sentence") for k in after)  # NSP head dropped
    assert tuple(after["classification_heads.sentence_classification_head.out_proj.weight"].shape) == (2, 32)


def test_hub_reproduces_the_finetuned_valid_accuracy(classifier, labelled):
    save, log = classifier
    valid = log_records(log, "valid")[-1]
    hub = _hub(save, labelled["cls"], labelled["data"] / "spm.model")
    assert isinstance(hub, RobertaHubInterface) and isinstance(hub.model, RealFormerBertModel)
    label_dict = Dictionary.load(str(labelled["cls"] / "label" / "dict.txt"))
    inputs = data_utils.load_indexed_dataset(str(labelled["cls"] / "input0" / "valid"), hub.task.source_dictionary)
    rows = labelled["splits"]["valid"]
    right = 0
    for i, (sentence, label) in enumerate(zip(labelled["sentences"][rows], labelled["cls_labels"][rows])):
        tokens = hub.encode(sentence)
        # hub.encode builds exactly what sentence_prediction feeds: <s> (--init-token 0) + line + </s>
        assert tokens.tolist() == [0] + inputs[i].tolist()
        predicted = hub.predict("sentence_classification_head", tokens).argmax().item()
        right += int(predicted == label_dict.index(label) - label_dict.nspecial)
    assert valid["accuracy"] == pytest.approx(100 * right / len(inputs), abs=0.05)


@pytest.mark.slow
def test_regression_head_finetunes_and_hub_reproduces_the_valid_loss(regressor, labelled):
    save, log = regressor
    valid = log_records(log, "valid")[-1]
    assert finite(valid["loss"])
    after = checkpoint_utils.load_checkpoint_to_cpu(str(save / "checkpoint_last.pt"))["model"]
    assert tuple(after["classification_heads.sentence_classification_head.out_proj.weight"].shape) == (1, 32)
    hub = _hub(save, labelled["reg"], labelled["data"] / "spm.model")
    rows = labelled["splits"]["valid"]
    squared = 0.0
    for sentence, target in zip(labelled["sentences"][rows], labelled["reg_labels"][rows]):
        value = hub.predict("sentence_classification_head", hub.encode(sentence), return_logits=True)
        squared += (value.item() - float(target)) ** 2
    # sentence_prediction logs sum of squared errors / sentences, in bits (/ ln 2)
    assert valid["loss"] == pytest.approx(squared / len(labelled["reg_labels"][rows]) / math.log(2), abs=2e-3)


def test_hub_interface_on_the_pretrained_checkpoint(pretrained, labelled):
    data = labelled["data"]
    hub = _hub(pretrained.parent, data, data / "spm.model")
    assert isinstance(hub, RobertaHubInterface)
    assert hub.model.residual.paths == frozenset({"encoder"})
    text = "The film was released in 2001 ."
    tokens = hub.encode(text)
    assert tokens[0] == 0 and tokens[-1] == 2 and hub.decode(tokens) == text

    features = hub.extract_features(tokens)
    hidden = hub.extract_features(tokens, return_all_hiddens=True)
    assert features.shape == (1, len(tokens), 32) and len(hidden) == 2 + 1
    torch.testing.assert_close(hidden[-1], features)

    filled = hub.fill_mask("The film was <mask> in 2001 .", topk=3)
    assert len(filled) == 3 and filled[0][1] >= filled[1][1] >= filled[2][1]
    # recompute the top prediction from the model's logits at the masked position
    left, right = hub.encode("The film was")[:-1], hub.encode("in 2001 .")[1:]
    masked = torch.cat([left, torch.tensor([hub.task.mask_idx]), right])
    with torch.no_grad():
        probs = hub.model(masked.unsqueeze(0))[0][0, len(left)].float().softmax(-1)
    top = probs.argmax().item()
    assert filled[0][1] == pytest.approx(probs[top].item(), abs=1e-5)
    assert filled[0][2].strip() == hub.bpe.decode(hub.task.source_dictionary[top]).strip()
    assert filled[0][0] == "The film was" + filled[0][2] + " in 2001 ."

    pair = hub.encode("The film was released in 2001 .", "It was a success .")
    log_probs = hub.predict("next_sentence", pair)
    assert log_probs.shape == (1, 2) and log_probs.exp().sum().item() == pytest.approx(1.0, abs=1e-5)
