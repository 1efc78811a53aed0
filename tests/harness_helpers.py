"""Helpers of the translation harness tests: the tiny recipe, data folders copied, the 2017 test sets.

Plain functions (the session fixtures built from them are in ``harness_fixtures``, a pytest plugin).
"""

import gzip
import json
import os
import shutil

from conftest import MULTI30K, require_shared_data

from realformer_tools.data import pipeline
from realformer_tools.experiments import compare

TINY_SIZE = dict(layers=2, embed_dim=32, ffn_dim=64, heads=2)


def tiny_recipe(**overrides):
    settings = dict(TINY_SIZE, max_update=4, warmup_updates=2, max_tokens=1000, beam=1, log_interval=2)
    settings.update(overrides)
    return compare.Recipe(**settings)


def copy_data(src, dest):
    """A data folder copied elsewhere, its prepare.json naming the copy's raw text."""
    shutil.copytree(src, dest)
    (dest / "prepare.json").write_text(json.dumps({"raw_dir": str(dest / "work" / "raw")}))
    return dest


def raw_2017(raw, sizes=(("test_2017_flickr", 16), ("test_2017_mscoco", 12))):
    """The first lines of the two 2017 test sets (En, De), gzipped as the official files are."""
    require_shared_data(MULTI30K)
    os.makedirs(raw, exist_ok=True)
    for name, n in sizes:
        for lang in pipeline.LANGS:
            with gzip.open(MULTI30K / f"{name}.{lang}.gz", "rt", encoding="utf-8") as f:
                lines = f.readlines()[:n]
            with gzip.open(raw / f"{name}.{lang}.gz", "wt", encoding="utf-8") as f:
                f.writelines(lines)
    return raw
