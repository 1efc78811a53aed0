"""Session fixtures of the translation harness tests, built once per test process (per xdist worker).

A pytest plugin (``pytest_plugins = ("harness_fixtures",)`` in the test files that use it): a
fixture imported into several test modules by name is built once per module, one registered as a
plugin once per session. ``m30k_slice`` (SentencePiece + fairseq-preprocess on the first Multi30k
sentences), ``m30k_three_sets`` (a copy with the 2017 test sets added) and ``tiny_comparison`` (the
three backbones trained by the harness on the slice) are read by test_compare_backbones,
test_import_results and test_evidence_harness; a test that trains or decodes into a folder copies it.
"""

import json
import shutil

import pytest
from conftest import MULTI30K, require_shared_data
from harness_helpers import copy_data, raw_2017, tiny_recipe

from realformer_tools.data import multi30k, pipeline
from realformer_tools.experiments import compare


@pytest.fixture(scope="session")
def m30k_slice(tmp_path_factory):
    """The first sentences of the real Multi30k splits: SentencePiece (vocab 200) + fairseq-preprocess,
    laid out as scripts/prepare_data.py does (prepare.json names the raw text)."""
    require_shared_data(MULTI30K)
    dest = tmp_path_factory.mktemp("m30k_slice")
    raw, spm_dir = dest / "work" / "raw", dest / "work" / "spm"
    sizes = {"train": 300, "valid": 24, "test": 20}
    for split, name in multi30k.MULTI30K_FILES.items():
        paths = [multi30k._find_raw_file(str(MULTI30K), name, lang) for lang in pipeline.LANGS]
        pairs, _ = pipeline.read_parallel(*paths)
        pipeline.write_split(str(raw), split, pairs[: sizes[split]])
    model = pipeline.train_sentencepiece(str(raw), str(spm_dir / "spm"), 200)
    pipeline.encode_files(model, str(raw), str(spm_dir))
    pipeline.binarize(str(spm_dir), str(dest))
    shutil.copyfile(model, dest / "spm.model")
    (dest / "prepare.json").write_text(json.dumps({"raw_dir": str(raw)}))
    return dest


@pytest.fixture(scope="session")
def m30k_three_sets(m30k_slice, tmp_path_factory):
    """``m30k_slice`` copied, with the 2017 test sets added (16 and 12 sentences) by
    ``corpora.add_test_sets``: three test sets, the headline test_2016_flickr first."""
    from realformer_tools.data import corpora

    root = tmp_path_factory.mktemp("m30k_three")
    dest = copy_data(m30k_slice, root / "m30k_slice")  # the same folder name: the same recipe
    corpora.add_test_sets(str(dest), raw_dir=str(raw_2017(root / "raw")))
    return dest


@pytest.fixture(scope="session")
def tiny_comparison(m30k_slice, tmp_path_factory):
    """The main comparison of ``tiny_recipe()`` (Post-LN, Pre-LN, RealFormer, seed 1, two fairseq
    trainings at once) on ``m30k_slice``: ``(out, results, summary, messages)``. Readers only: a test
    that trains or decodes into a run folder makes its own."""
    root = tmp_path_factory.mktemp("tiny_comparison")
    out, results, messages = root / "runs", root / "results" / "m30k.json", []
    summary = compare.compare(str(m30k_slice), str(out), tiny_recipe(), results_path=str(results),
                              threads=1, log=messages.append, jobs=2)
    return out, results, summary, messages
