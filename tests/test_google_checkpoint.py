"""Google's released RealFormer BERT checkpoints: the TF checkpoint reader, the
converter, and the converted model against an independent NumPy implementation of the
official graph (``google_bert_reference``).

The fixture (``tests/fixtures/google_realformer``, written once by TensorFlow with
``make_fixture.py``): a 2-layer, hidden-32 checkpoint with the official variable names,
BERT's pre-training heads, Adam slots and ``global_step``; TensorFlow's own reading of
every variable (``tf_variables.json``); and the official ``realformer.py`` graph's
outputs on fixed inputs (``official_outputs.npz``).
"""

import hashlib
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import google_bert_reference as ref
import numpy as np
import pytest
import torch
from bert_helpers import USER_DIR
from conftest import REPO, cli_env
from fairseq import checkpoint_utils
from inprocess import run_in_process

from realformer_nmt.errors import CheckpointFileError, ConfigError
from realformer_nmt.models.realformer_bert import RealFormerBertModel
from realformer_nmt.models.realformer_bert.wordpiece import WordPieceTokenizer
from realformer_tools.convert import google_checkpoint as gc
from realformer_tools.convert.tf_checkpoint import TFCheckpoint, TFCheckpointError, crc32c

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "google_realformer"
CKPT = FIXTURE / "bert_tiny"
PREFIX = CKPT / "bert_model.ckpt"
CONFIG = json.loads((CKPT / "bert_config.json").read_text())
VOCAB = (CKPT / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]
OFFICIAL = np.load(FIXTURE / "official_outputs.npz")
MLM_POSITIONS = [1, 2, 3]  # make_fixture.py kept the official MLM logits of these positions
BERT_TO_FAIRSEQ = {"[CLS]": "<s>", "[PAD]": "<pad>", "[SEP]": "</s>", "[UNK]": "<unk>", "[MASK]": "<mask>"}
ATOL = 1e-5


# fairseq's own checkpoint loaders run in this process: with the fixes (torch >= 2.6)
pytestmark = pytest.mark.usefixtures("fairseq_fixes")


def model_variables():
    tf = TFCheckpoint(str(PREFIX))
    return {n: tf.read(n) for n in tf.names() if not n.endswith(("/adam_m", "/adam_v")) and n != "global_step"}


VARIABLES = model_variables()


def batch(name):
    return [OFFICIAL[f"inputs/{name}/{k}"] for k in ("input_ids", "input_mask", "token_type_ids")]


def copy_fixture(dest, **config):
    """The fixture checkpoint in ``dest`` with ``bert_config.json`` changed."""
    shutil.copytree(CKPT, dest)
    (dest / "bert_config.json").write_text(json.dumps({**CONFIG, **config}))
    return dest


def hub_of(folder, **kwargs):
    return RealFormerBertModel.from_pretrained(str(folder), **kwargs).eval()


def to_fairseq(hub, wordpiece_ids):
    """WordPiece ids -> the hub's dictionary ids, through the token strings."""
    d = hub.task.source_dictionary
    rows = np.asarray(wordpiece_ids)
    out = torch.tensor([[d.index(BERT_TO_FAIRSEQ.get(VOCAB[i], VOCAB[i])) for i in row] for row in rows])
    assert not out.eq(d.unk()).any() or "[UNK]" in [VOCAB[i] for i in np.ravel(wordpiece_ids)]
    return out


def fairseq_to_wordpiece(hub):
    """Column j of the hub's LM logits is WordPiece id ``result[j]``."""
    inverse = {f: b for b, f in BERT_TO_FAIRSEQ.items()}
    d = hub.task.source_dictionary
    return [VOCAB.index(inverse.get(d[j], d[j])) for j in range(len(d))]


def outputs(hub, tokens):
    """Sequence output, pooled output, LM logits and NSP logits of the converted model."""
    model = hub.model
    with torch.no_grad():
        features, _ = model(tokens, features_only=True)
        head = model.classification_heads["next_sentence"]
        pooled = head.activation_fn(head.dense(features[:, 0]))
        logits, _ = model(tokens)
        nsp = head(features)
    return features.double(), pooled.double(), logits.double(), nsp.double()


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """{"sum": folder, "mean": folder}: the fixture converted, as is and with use_running_mean."""
    root = tmp_path_factory.mktemp("converted")
    out = {"sum": root / "sum", "mean": root / "mean"}
    gc.convert(str(CKPT), str(out["sum"]))
    gc.convert(str(copy_fixture(root / "src_mean", use_running_mean=True)), str(out["mean"]))
    return out


# --------------------------------------------------------------------------------------
# the TensorFlow checkpoint reader
# --------------------------------------------------------------------------------------


def test_crc32c_of_the_standard_check_string_and_of_long_inputs():
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value
    # long inputs take the chunked NumPy path; the textbook bit-by-bit CRC gives the same
    data = np.random.default_rng(0).integers(0, 256, 100_003, dtype=np.uint8).tobytes()
    register = 0xFFFFFFFF
    for b in data:
        register ^= b
        for _ in range(8):
            register = (register >> 1) ^ (0x82F63B78 if register & 1 else 0)
    assert crc32c(data) == register ^ 0xFFFFFFFF


@pytest.mark.parametrize("checkpoint", ["bert_tiny/bert_model.ckpt", "typed_variables/typed.ckpt"])
def test_reader_returns_what_tensorflow_reads(checkpoint):
    """Every variable (Adam slots, global_step, float64/int32/bfloat16/float16 included):
    same names, dtypes, shapes and bytes as tf.train.load_checkpoint, checksums verified."""
    manifest = json.loads((FIXTURE / "tf_variables.json").read_text())[checkpoint]
    tf = TFCheckpoint(str(FIXTURE / checkpoint))
    assert tf.names() == sorted(manifest)
    for name, (dtype, shape, digest) in manifest.items():
        value = tf.read(name)
        assert str(value.dtype) == ("float32" if dtype == "bfloat16" else dtype), name
        assert list(value.shape) == shape, name
        assert hashlib.sha256(value.tobytes()).hexdigest()[:16] == digest, name


def test_reader_reports_a_corrupted_tensor_by_name(tmp_path):
    src = copy_fixture(tmp_path / "ckpt")
    tf = TFCheckpoint(str(src / "bert_model.ckpt"))
    entry = tf.entry("bert/pooler/dense/kernel")
    data = src / "bert_model.ckpt.data-00000-of-00001"
    raw = bytearray(data.read_bytes())
    raw[entry.offset + 5] ^= 0x10
    data.write_bytes(bytes(raw))
    with pytest.raises(TFCheckpointError, match="checksum mismatch in bert/pooler/dense/kernel"):
        tf.read("bert/pooler/dense/kernel")
    tf.read("bert/pooler/dense/kernel", verify=False)  # readable when asked not to check
    tf.read("bert/pooler/dense/bias")  # the other tensors are fine


def test_reader_rejects_a_file_that_is_not_a_checkpoint_index(tmp_path):
    bad = tmp_path / "x.index"
    bad.write_bytes((CKPT / "bert_model.ckpt.index").read_bytes()[:-10])
    with pytest.raises(TFCheckpointError, match="is not a TensorFlow V2 checkpoint index"):
        TFCheckpoint(str(bad))


def test_converter_imports_without_tensorflow():
    code = ("import sys, realformer_nmt\n"
            "from realformer_tools.convert import google_checkpoint\n"
            "assert not any(m == 'tensorflow' or m.startswith('tensorflow.') for m in sys.modules)\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, env=cli_env(), capture_output=True)


class _StandInTensorFlow:
    """Just enough of ``tensorflow`` for ``TensorFlowCheckpoint``: ``tf.train.load_checkpoint``
    answering TensorFlow's reader API (shape and dtype maps, ``get_tensor``) from the values
    TensorFlow itself recorded for the fixture (``tf_variables.json``: dtype, shape, SHA-256,
    checked against the builtin reader above). It tests the adapter's wiring only; the real
    TensorFlow reader is compared in the test after it, where TensorFlow is installed."""

    ENUMS = {"float32": 1, "float64": 2, "int32": 3, "int64": 9, "bfloat16": 14, "float16": 19}

    def __init__(self):
        self.train = self

    def load_checkpoint(self, prefix):
        builtin = TFCheckpoint(prefix)
        dtype_enum = {n: builtin.entry(n).dtype for n in builtin.names()}

        class DType:
            def __init__(self, enum):
                self.as_datatype_enum = enum

        class Reader:
            def get_variable_to_shape_map(self):
                return {n: list(builtin.entry(n).shape) for n in builtin.names()}

            def get_variable_to_dtype_map(self):
                return {n: DType(e) for n, e in dtype_enum.items()}

            def get_tensor(self, name):
                value = builtin.read(name)
                if dtype_enum[name] == 14:  # TensorFlow hands bfloat16 out as bfloat16, not widened
                    import ml_dtypes  # noqa: F401  (only where installed)
                    value = value.astype("bfloat16")
                return value

        return Reader()


def test_tensorflow_reader_converts_identically_through_its_api(converted, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow", _StandInTensorFlow())
    summary = gc.convert(str(CKPT), str(tmp_path / "tf_reader"), reader="tensorflow")
    assert summary["reader"] == "tensorflow"
    reference = state_of(converted["sum"])
    state = state_of(tmp_path / "tf_reader")
    assert state.keys() == reference.keys()
    assert all(torch.equal(state[k], reference[k]) for k in state)


def test_tensorflow_reader_without_tensorflow_is_one_line(tmp_path):
    try:
        import tensorflow  # noqa: F401
        pytest.skip("TensorFlow is installed here")
    except ImportError:
        pass
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "convert_google_checkpoint.py"), str(CKPT),
                           "--out", str(tmp_path / "out"), "--reader", "tensorflow"],
                          capture_output=True, text=True, env=cli_env(), cwd=REPO)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert errors == ["convert_google_checkpoint.py: error: --reader tensorflow needs TensorFlow "
                      "(pip install tensorflow-cpu); the default --reader builtin needs nothing beyond NumPy"]
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("checkpoint", ["bert_tiny/bert_model.ckpt", "typed_variables/typed.ckpt"])
def test_tensorflow_reader_equals_the_builtin_one(checkpoint):
    pytest.importorskip("tensorflow")
    from realformer_tools.convert.tf_checkpoint import TensorFlowCheckpoint

    builtin, tf = TFCheckpoint(str(FIXTURE / checkpoint)), TensorFlowCheckpoint(str(FIXTURE / checkpoint))
    assert tf.names() == builtin.names()
    for name in builtin.names():
        a, b = builtin.read(name), tf.read(name)
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), name


# --------------------------------------------------------------------------------------
# the NumPy reference against the official graph
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("inputs", ["single", "pairs"])
def test_numpy_reference_equals_the_official_tensorflow_graph(mode, inputs):
    config = {**CONFIG, "use_running_mean": mode == "mean"}
    sequence, pooled = ref.encoder(VARIABLES, config, *batch(inputs))
    got = {"sequence": sequence, "pooled": pooled, "mlm": ref.mlm_logits(VARIABLES, config, sequence)[:, MLM_POSITIONS],
           "nsp": ref.nsp_logits(VARIABLES, pooled)}
    for key, value in got.items():
        np.testing.assert_allclose(value, OFFICIAL[f"{mode}/{inputs}/{key}"], atol=ATOL, rtol=0, err_msg=key)


# --------------------------------------------------------------------------------------
# the converted model against the reference
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["sum", "mean"])
@pytest.mark.parametrize("inputs", ["single", "pairs"])
def test_converted_model_equals_the_reference(converted, mode, inputs):
    """Sequence output (every position, padded ones included), pooled output, MLM logits
    and NSP logits, on right-padded single sentences and on sentence pairs."""
    hub = hub_of(converted[mode])
    ids, mask, types = batch(inputs)
    tokens = to_fairseq(hub, ids)
    assert tokens.eq(hub.task.source_dictionary.pad()).any()  # padded rows in the batch
    config = {**CONFIG, "use_running_mean": mode == "mean"}
    sequence, pooled = ref.encoder(VARIABLES, config, ids, mask, types)
    mlm = ref.mlm_logits(VARIABLES, config, sequence)[..., fairseq_to_wordpiece(hub)]
    nsp = ref.nsp_logits(VARIABLES, pooled)[:, ::-1]  # converted head: class 1 = is next
    got = outputs(hub, tokens)
    for name, actual, expected in zip(("sequence", "pooled", "mlm", "nsp"), got, (sequence, pooled, mlm, nsp)):
        torch.testing.assert_close(actual, torch.from_numpy(expected.copy()), atol=ATOL, rtol=0, msg=name)


def test_sum_and_mean_and_the_residual_path_change_the_outputs(converted):
    """The comparisons above can fail: the fixture's attention is peaked enough that the
    rule (sum/mean) and the residual scores change the output by far more than 1e-5."""
    ids, mask, types = batch("pairs")
    sums, _ = ref.encoder(VARIABLES, CONFIG, ids, mask, types)
    means, _ = ref.encoder(VARIABLES, {**CONFIG, "use_running_mean": True}, ids, mask, types)
    vanilla, _ = ref.encoder(VARIABLES, CONFIG, ids, mask, types, residual=False)
    assert np.abs(sums - means).max() > 0.1 and np.abs(sums - vanilla).max() > 0.1


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_paths_none_equals_vanilla_bert(converted, mode):
    hub = hub_of(converted[mode], residual_attention_paths="none")
    assert hub.model.residual.paths == frozenset()
    ids, mask, types = batch("pairs")
    sequence, pooled = ref.encoder(VARIABLES, {**CONFIG, "use_running_mean": mode == "mean"}, ids, mask, types,
                                   residual=False)
    features, got_pooled, _, _ = outputs(hub, to_fairseq(hub, ids))
    torch.testing.assert_close(features, torch.from_numpy(sequence), atol=ATOL, rtol=0)
    torch.testing.assert_close(got_pooled, torch.from_numpy(pooled), atol=ATOL, rtol=0)


def wordpiece_ids(*pieces):
    return np.array([[VOCAB.index(p) for p in pieces]])


def test_fill_mask_returns_the_reference_top_token(converted):
    hub = hub_of(converted["sum"])
    tok = WordPieceTokenizer(VOCAB)
    left, right = "the cat sat on the", "house ."
    ids = wordpiece_ids("[CLS]", *tok.tokenize(left), "[MASK]", *tok.tokenize(right), "[SEP]")
    position = 1 + len(tok.tokenize(left))
    sequence, _ = ref.encoder(VARIABLES, CONFIG, ids, np.ones_like(ids), np.zeros_like(ids))
    logits = ref.mlm_logits(VARIABLES, CONFIG, sequence)[0, position]
    top = int(logits.argmax())
    probs = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    assert np.sort(probs)[-1] - np.sort(probs)[-2] > 1e-3  # a clear winner: float32 cannot flip it
    assert not VOCAB[top].startswith("[")

    filled = hub.fill_mask(f"{left} <mask> {right}", topk=3)
    sentence, prob, token = filled[0]
    assert token == VOCAB[top]
    assert prob == pytest.approx(probs[top], abs=ATOL)
    assert sentence == f"{left} {VOCAB[top]} {right}"


def test_encode_lays_a_pair_out_as_bert_and_predict_gives_the_reference_nsp(converted):
    hub = hub_of(converted["sum"])
    tok = WordPieceTokenizer(VOCAB)
    a, b = "the king died .", "his band became great ."
    ids = wordpiece_ids("[CLS]", *tok.tokenize(a), "[SEP]", *tok.tokenize(b), "[SEP]")
    tokens = hub.encode(a, b)
    assert tokens.tolist() == to_fairseq(hub, ids)[0].tolist()  # [CLS] A [SEP] B [SEP], one separator
    assert hub.encode(a, b, no_separator=False).tolist().count(hub.task.source_dictionary.eos()) == 3
    types = np.array([[0] * (len(tok.tokenize(a)) + 2) + [1] * (len(tok.tokenize(b)) + 1)])
    sequence, pooled = ref.encoder(VARIABLES, CONFIG, ids, np.ones_like(ids), types)
    features = hub.extract_features(tokens).detach()
    torch.testing.assert_close(features[0].double(), torch.from_numpy(sequence[0]), atol=ATOL, rtol=0)
    nsp = ref.nsp_logits(VARIABLES, pooled)[0]
    expected = nsp[::-1] - np.log(np.exp(nsp).sum())
    log_probs = hub.predict("next_sentence", tokens)
    torch.testing.assert_close(log_probs[0].double(), torch.from_numpy(expected.copy()), atol=ATOL, rtol=0)
    # the segment ids matter: with B in segment 0 the reference is far from this
    one_segment, _ = ref.encoder(VARIABLES, CONFIG, ids, np.ones_like(ids), np.zeros_like(ids))
    assert np.abs(one_segment[0] - features[0].double().numpy()).max() > 0.1


def test_fairseqs_bert_bpe_works_with_the_converted_folder(converted):
    """fairseq's own --bpe bert (HuggingFace BertTokenizer) on the converted vocab.txt."""
    pytest.importorskip("transformers")
    folder = converted["sum"]
    ours = hub_of(folder)
    theirs = hub_of(folder, bpe="bert", bpe_vocab_file=str(folder / "vocab.txt"))
    assert type(theirs.bpe).__name__ == "BertBPE"
    a, b = "The King died, his band became GREAT.", "the dog ran to the river"
    assert torch.equal(theirs.encode(a, b), ours.encode(a, b))
    assert theirs.fill_mask("the cat sat on the <mask> house .", topk=2) == ours.fill_mask(
        "the cat sat on the <mask> house .", topk=2)


# --------------------------------------------------------------------------------------
# the converter: inputs, special tokens, errors
# --------------------------------------------------------------------------------------


def state_of(folder):
    return checkpoint_utils.load_checkpoint_to_cpu(str(folder / "model.pt"))["model"]


def test_zip_folder_and_index_path_convert_identically(converted, tmp_path):
    archive = tmp_path / "bert_tiny.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as z:  # as the released zips: a top folder
        for f in CKPT.iterdir():
            z.write(f, f"bert_tiny/{f.name}")
    from_zip = gc.convert(str(archive), str(tmp_path / "from_zip"))
    from_index = gc.convert(str(PREFIX) + ".index", str(tmp_path / "from_index"))
    assert from_zip["source"] == "bert_tiny.zip" and from_index["checkpoint"] == "bert_model.ckpt"
    reference = state_of(converted["sum"])
    for folder in ("from_zip", "from_index"):
        state = state_of(tmp_path / folder)
        assert state.keys() == reference.keys()
        assert all(torch.equal(state[k], reference[k]) for k in state)
    for name in ("dict.txt", "vocab.txt"):
        assert (tmp_path / "from_zip" / name).read_text() == (converted["sum"] / name).read_text()


def test_several_checkpoints_in_a_folder_need_choosing(converted, tmp_path):
    src = copy_fixture(tmp_path / "two")
    for suffix in ("index", "data-00000-of-00001"):
        shutil.copy(src / f"bert_model.ckpt.{suffix}", src / f"model.ckpt-1000.{suffix}")
    with pytest.raises(CheckpointFileError, match=r"several checkpoints \(\*\.index\): bert_model.ckpt, "
                                                  r"model.ckpt-1000 \(choose one with --checkpoint NAME\)"):
        gc.convert(str(src), str(tmp_path / "out"))
    summary = gc.convert(str(src), str(tmp_path / "out"), checkpoint="model.ckpt-1000")
    assert summary["checkpoint"] == "model.ckpt-1000"


def test_optimizer_slots_and_global_step_are_skipped_and_counted(converted):
    summary = json.loads((converted["sum"] / "conversion.json").read_text())
    manifest = json.loads((FIXTURE / "tf_variables.json").read_text())["bert_tiny/bert_model.ckpt"]
    slots = [n for n in manifest if n.endswith(("/adam_m", "/adam_v"))]
    assert len(slots) == 2 * 46
    assert summary["skipped"] == {"optimizer slots": len(slots), "bookkeeping": 1, "--ignore-variables": 0}
    assert summary["model_variables"] == len(manifest) - len(slots) - 1
    assert summary["heads"] == {"masked_lm": True, "next_sentence": True}
    assert not any(k.endswith(("adam_m", "adam_v")) for k in state_of(converted["sum"]))


def test_dictionary_keeps_the_wordpiece_order_with_specials_on_fairseqs(converted):
    hub = hub_of(converted["sum"])
    d = hub.task.source_dictionary
    assert len(d) == len(VOCAB)  # <mask> is in dict.txt, not appended
    assert [d[i] for i in range(4)] == ["<s>", "<pad>", "</s>", "<unk>"]
    rest = [BERT_TO_FAIRSEQ.get(t, t) for t in VOCAB if t not in ("[CLS]", "[PAD]", "[SEP]", "[UNK]")]
    assert [d[i] for i in range(4, len(d))] == rest
    assert hub.task.mask_idx == d.index("<mask>") == 4 + rest.index("<mask>")


def test_special_tokens_are_found_by_their_strings_at_any_id(converted, tmp_path):
    """The same model with its vocabulary listed backwards ([PAD] last, [CLS] at 287...):
    the specials land on fairseq's, and the converted model computes the same."""
    ckpt = gc.read_google_checkpoint(str(CKPT))
    order = list(reversed(range(len(VOCAB))))
    variables = dict(ckpt.variables)
    variables["bert/embeddings/word_embeddings"] = variables["bert/embeddings/word_embeddings"][order]
    variables["cls/predictions/output_bias"] = variables["cls/predictions/output_bias"][order]
    vocab = [VOCAB[i] for i in order]
    summary = gc.write_fairseq_checkpoint(ckpt._replace(vocab=vocab, variables=variables), str(tmp_path / "rev"))
    cls = {"fairseq": "<s>", "fairseq_id": 0, "wordpiece_id": vocab.index("[CLS]")}
    assert summary["special_tokens"]["[CLS]"] == cls
    assert summary["special_tokens"]["[PAD]"]["wordpiece_id"] == len(VOCAB) - 1
    reversed_hub, hub = hub_of(tmp_path / "rev"), hub_of(converted["sum"])
    a, b = "the ship sat in the sea", "the dog ran ."
    for h in (hub, reversed_hub):
        d = h.task.source_dictionary
        assert " ".join(d[i] for i in h.encode(a, b)) == f"<s> {a} </s> {b} </s>"
    torch.testing.assert_close(reversed_hub.extract_features(reversed_hub.encode(a, b)),
                               hub.extract_features(hub.encode(a, b)), atol=1e-6, rtol=0)
    masked = "the <mask> ran ."
    for got, expected in zip(reversed_hub.fill_mask(masked, topk=2), hub.fill_mask(masked, topk=2)):
        assert got[0] == expected[0] and got[1] == pytest.approx(expected[1], abs=1e-6)


CONVERT_SCRIPT = REPO / "scripts" / "convert_google_checkpoint.py"


def convert_script(*args):
    """The script's main in this process (tests/inprocess.py: stdout, stderr and exit status as a
    subprocess gives them); test_tensorflow_reader_without_tensorflow_is_one_line runs the script."""
    return run_in_process("realformer-convert-google-checkpoint", *args, check=False, cwd=REPO, argv0=CONVERT_SCRIPT)


def test_unknown_variables_are_a_one_line_error_naming_them(tmp_path):
    src = copy_fixture(tmp_path / "one_layer", num_hidden_layers=1)
    proc = convert_script(src, "--out", tmp_path / "out")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("convert_google_checkpoint.py: error: bert_model.ckpt: unknown variables ")
    assert "bert/encoder/layer_1/attention/output/LayerNorm/beta" in last and "(16 in all)" in last
    assert not (tmp_path / "out" / "model.pt").exists()


def test_ignore_variables_skips_them(tmp_path):
    src = copy_fixture(tmp_path / "one_layer", num_hidden_layers=1)
    summary = gc.convert(str(src), str(tmp_path / "out"), ignore=r"^bert/encoder/layer_1/")
    assert summary["skipped"]["--ignore-variables"] == 16
    assert hub_of(tmp_path / "out").model.args.encoder_layers == 1


def test_ignoring_a_variable_the_model_needs_is_reported_missing_or_drops_its_head(tmp_path):
    with pytest.raises(CheckpointFileError, match=r"missing variables bert/pooler/dense/bias$"):
        gc.convert(str(CKPT), str(tmp_path / "a"), ignore=r"^bert/pooler/dense/bias$")
    summary = gc.convert(str(CKPT), str(tmp_path / "b"), ignore=r"^cls/")  # both heads dropped
    assert summary["skipped"]["--ignore-variables"] > 0
    model = hub_of(tmp_path / "b").model
    assert "next_sentence" not in model.classification_heads


def test_a_bad_ignore_pattern_or_a_file_that_is_not_a_zip_is_one_line(tmp_path):
    fake = tmp_path / "fake.zip"
    fake.write_text("not a zip")
    for args, message in ((["--ignore-variables", "("], "--ignore-variables '(' is not a regular expression"),
                          ([], "fake.zip: not a zip file, a folder or a checkpoint's .index file")):
        source = str(CKPT) if args else str(fake)
        proc = convert_script(source, "--out", tmp_path / "out", *args)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert message in proc.stderr.strip().splitlines()[-1]


def test_vocabulary_problems_are_found_before_variables_are_read(tmp_path, monkeypatch):
    src = copy_fixture(tmp_path / "no_mask")
    vocab = (src / "vocab.txt").read_text(encoding="utf-8").replace("[MASK]\n", "[MASQUE]\n")
    (src / "vocab.txt").write_text(vocab, encoding="utf-8")
    monkeypatch.setattr(TFCheckpoint, "read", lambda *a, **k: pytest.fail("a variable was read"))
    with pytest.raises(ConfigError, match=r"\[MASK\]"):
        gc.convert(str(src), str(tmp_path / "out"))


def test_missing_variables_are_an_error_naming_them(tmp_path):
    src = copy_fixture(tmp_path / "three_layers", num_hidden_layers=3)
    expected = r"^bert_model.ckpt: missing variables bert/encoder/layer_2/attention/self/query/kernel, .*\(16 in all\)$"
    with pytest.raises(CheckpointFileError, match=expected):
        gc.convert(str(src), str(tmp_path / "out"))


def test_shapes_that_contradict_the_config_are_an_error(tmp_path):
    src = copy_fixture(tmp_path / "ffn", intermediate_size=65)
    expected = r"shapes differ from bert_config.json: .*intermediate/dense/bias \[64\] \(expected \[65\]\)"
    with pytest.raises(CheckpointFileError, match=expected):
        gc.convert(str(src), str(tmp_path / "out"))


def test_a_vocabulary_without_a_special_token_is_an_error(tmp_path):
    src = copy_fixture(tmp_path / "vocab")
    (src / "vocab.txt").write_text("\n".join(t if t != "[MASK]" else "[unused99]" for t in VOCAB) + "\n")
    with pytest.raises(ConfigError, match=r"has no \[MASK\]"):
        gc.convert(str(src), str(tmp_path / "out"))


def test_new_classification_heads_start_from_the_pretrained_pooler(converted):
    """--pooler-init-head (on in realformer_bert_google): as BERT fine-tunes its pooler."""
    hub = hub_of(converted["sum"])
    state = state_of(converted["sum"])
    model = hub.model
    model.register_classification_head("sentence_classification_head", num_classes=3)
    fresh = model.classification_heads["sentence_classification_head"].out_proj.weight.detach().clone()
    model.load_state_dict(state, strict=True)  # as --restore-file does: the checkpoint lacks the new head
    head = model.classification_heads["sentence_classification_head"]
    torch.testing.assert_close(head.dense.weight, state["classification_heads.next_sentence.dense.weight"])
    torch.testing.assert_close(head.out_proj.weight, fresh)  # the classifier itself is new


# --------------------------------------------------------------------------------------
# the BERT-exact options themselves
# --------------------------------------------------------------------------------------


def test_segment_ids_follow_berts_pair_layout():
    from realformer_nmt.models.realformer_bert.sentence_encoder import segment_ids

    bos, pad, eos = 0, 1, 2
    tokens = torch.tensor([
        [bos, 5, 6, eos, 7, 8, eos, pad, pad],  # <s> A </s> B </s>: [CLS] A [SEP] = 0, B [SEP] = 1
        [bos, 5, eos, pad, pad, pad, pad, pad, pad],  # a single sentence
        [bos, 5, eos, eos, 7, eos, pad, pad, pad],  # RoBERTa's doubled separator: B's side from the second
    ])
    assert segment_ids(tokens, eos, pad, num_segments=2).tolist() == [
        [0, 0, 0, 0, 1, 1, 1, 0, 0],
        [0, 0, 0, 0, 0, 0, 0, 0, 0],
        [0, 0, 0, 1, 1, 1, 0, 0, 0],
    ]
    assert not segment_ids(tokens, eos, pad, num_segments=1).any()


def test_models_trained_here_keep_robertas_embeddings():
    """Defaults unchanged: no segment embeddings, fairseq's positions and LayerNorm epsilon."""
    from bert_helpers import build_bert
    from fairseq.modules import LearnedPositionalEmbedding

    model = build_bert("realformer_bert")
    encoder = model.encoder.sentence_encoder
    assert encoder.segment_embeddings is None and encoder.zero_padding_embeddings
    assert isinstance(encoder.embed_positions, LearnedPositionalEmbedding)
    assert {m.eps for m in model.modules() if isinstance(m, torch.nn.LayerNorm)} == {1e-5}
    assert not any("segment" in k for k in model.state_dict())
    google = build_bert("realformer_bert_google")
    assert google.encoder.sentence_encoder.segment_embeddings.num_embeddings == 2
    assert {m.eps for m in google.modules() if isinstance(m, torch.nn.LayerNorm)} == {1e-12}
    assert google.args.activation_fn == "gelu_accurate"


# --------------------------------------------------------------------------------------
# fine-tuning a converted checkpoint with fairseq-train
# --------------------------------------------------------------------------------------


def toy_pairs(n, seed):
    """Sentence pairs over the fixture's words; label 1 when B is A backwards."""
    words = [t for t in VOCAB[60:200] if t.isalpha()]
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        a = list(rng.choice(words, size=rng.integers(3, 7)))
        b = a[::-1] if i % 2 else list(rng.choice(words, size=len(a)))
        rows.append((" ".join(a), " ".join(b), str(i % 2)))
    return rows


@pytest.mark.slow
def test_converted_checkpoint_finetunes_with_sentence_prediction(converted, tmp_path):
    """One epoch of fairseq-train --task sentence_prediction from the converted model.pt,
    with the flags conversion.json gives; pairs laid out as BERT's (--init-token 0, no
    --separator-token); the new head's dense layer starts from BERT's pooler."""
    folder = converted["sum"]
    summary = json.loads((folder / "conversion.json").read_text())
    tok = WordPieceTokenizer.from_file(str(folder / "vocab.txt"))
    raw, data = tmp_path / "raw", tmp_path / "data"
    raw.mkdir()
    for split, rows in (("train", toy_pairs(48, 0)), ("valid", toy_pairs(16, 1))):
        for k, column in enumerate(zip(*rows)):
            name = ("input0", "input1", "label")[k]
            lines = column if name == "label" else [" ".join(tok.tokenize(s)) for s in column]
            (raw / f"{split}.{name}").write_text("\n".join(lines) + "\n")
    for name in ("input0", "input1", "label"):
        dictionary = ["--srcdict", folder / "dict.txt"] if name != "label" else []
        run_in_process("fairseq-preprocess", "--only-source", "--trainpref", raw / f"train.{name}", "--validpref",
            raw / f"valid.{name}", "--destdir", data / name, "--workers", 1, *dictionary)
    save = tmp_path / "save"
    proc = run_in_process(  # fairseq's tools in this process (tests/inprocess.py)
        "fairseq-train", data, "--user-dir", USER_DIR, "--task", "sentence_prediction", "--num-classes", 2,
        "--init-token", 0, "--criterion", "sentence_prediction", *summary["finetune_flags"],
        "--restore-file", folder / "model.pt", "--reset-optimizer", "--reset-dataloader", "--reset-meters",
        "--batch-size", 8, "--required-batch-size-multiple", 1, "--optimizer", "adam", "--lr", 1e-4,
        "--max-epoch", 1, "--cpu", "--no-progress-bar", "--log-format", "simple", "--log-interval", 2,
        "--no-epoch-checkpoints", "--seed", 1, "--num-workers", 0, "--save-dir", save,
        "--best-checkpoint-metric", "accuracy", "--maximize-best-checkpoint-metric",
    )
    log = proc.stdout + proc.stderr
    assert f"Loaded checkpoint {folder / 'model.pt'}" in log
    assert "classification head sentence_classification_head: dense layer from the restored next_sentence head" in log
    assert "end of epoch 1" in log and "| valid |" in log and "accuracy" in log
    before, after = state_of(folder), checkpoint_utils.load_checkpoint_to_cpu(str(save / "checkpoint_last.pt"))["model"]
    encoder = [k for k in before if k.startswith("encoder.sentence_encoder.")]
    drift = max((after[k] - before[k]).abs().max().item() for k in encoder)
    assert 0 < drift < 1e-2  # 6 Adam steps at lr 1e-4 from the converted weights
    pooler = before["classification_heads.next_sentence.dense.weight"]
    head = after["classification_heads.sentence_classification_head.dense.weight"]
    assert (head - pooler).abs().max().item() < 1e-2 and not torch.equal(head, pooler)
