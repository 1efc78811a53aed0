"""A launched fairseq command starts without importing scikit-learn or scipy.stats
(``realformer_tools.deferred_imports``), and the functions fairseq 0.12 took from them
compute what the libraries' own compute: against scikit-learn and scipy imported afterwards
in the same fresh interpreter, on inputs where each score is neither 0 nor 1."""

import json
import subprocess
import sys

import pytest
from conftest import cli_env

from realformer_tools import deferred_imports

HEAVY = ("sklearn", "scipy.stats", "pandas")

CHECK = r"""
import json, sys, types
from realformer_tools import deferred_imports
with deferred_imports.deferred():
    import fairseq_cli.generate  # what the launcher's main() loads for fairseq-generate
    inside = sorted(n for n in sys.modules if isinstance(sys.modules[n], deferred_imports.DeferredModule))
loaded = sorted(n for n in %(heavy)r if n in sys.modules)
left = sorted(n for n, m in sys.modules.items() if isinstance(m, deferred_imports.DeferredModule))
from fairseq.criterions import sentence_prediction as sp
from fairseq.tasks import audio_classification as ac
y, p = [0, 1, 1, 0, 1, 1, 0, 0, 1, 0], [0, 1, 0, 0, 1, 1, 1, 0, 1, 1]
a, b = [0.1, 0.4, 0.35, 0.8, 0.2, 0.9, 0.5], [0.3, 0.2, 0.5, 0.7, 0.1, 0.95, 0.4]
fairseqs = [sp.f1_score(y, p), sp._matthews_corrcoef(y, p), float(sp.pearsonr(a, b)[0]),
            float(sp.spearmanr(a, b)[0]), float(ac.sklearn_metrics.roc_auc_score(y, a + b[:3]))]
import scipy.stats, sklearn, sklearn.metrics
real = [sklearn.metrics.f1_score(y, p), sklearn.metrics.matthews_corrcoef(y, p), float(scipy.stats.pearsonr(a, b)[0]),
        float(scipy.stats.spearmanr(a, b)[0]), float(sklearn.metrics.roc_auc_score(y, a + b[:3]))]
print(json.dumps(dict(inside=inside, loaded=loaded, left=left, fairseqs=fairseqs, real=real,
                      real_modules=[type(sklearn) is types.ModuleType, type(sklearn.metrics) is types.ModuleType,
                                    type(scipy.stats) is types.ModuleType],
                      bound=[sp.f1_score.__module__, sp.pearsonr.__name__])))
"""


def _fresh(code):
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=cli_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_fairseq_imports_without_them_and_their_functions_compute_the_libraries_scores():
    got = json.loads(_fresh(CHECK % {"heavy": HEAVY}).splitlines()[-1])
    assert got["inside"] == sorted(deferred_imports.STAND_INS)  # all four stood in while fairseq imported
    assert got["loaded"] == [] and got["left"] == []  # none imported by fairseq; none left in sys.modules
    assert got["real_modules"] == [True, True, True]  # imported afterwards: the real modules
    assert got["bound"] == ["sklearn.metrics", "pearsonr"]
    assert all(0 < abs(v) < 1 for v in got["real"])  # scores that tell a wrong function from the right one
    assert got["fairseqs"] == got["real"]  # the same floats, computed by the libraries


def test_a_launched_command_loads_neither_and_a_program_that_has_them_keeps_them():
    out = _fresh("import sys\nfrom realformer_tools.launch import main\n"
                 "code = main(['fairseq-generate', '--help'])\n"
                 f"print(code, sorted(n for n in {HEAVY!r} if n in sys.modules))")
    assert out.splitlines()[-1] == "0 []"  # the usage printed, fairseq loaded, neither library
    # this process has imported fairseq and scikit-learn: the block changes nothing
    import sklearn.metrics

    before = dict(sys.modules)
    with deferred_imports.deferred():
        assert sys.modules["sklearn.metrics"] is sklearn.metrics and sys.modules == before


def test_a_stand_in_looked_up_inside_the_block_imports_the_real_module():
    code = ("import sys\nfrom realformer_tools import deferred_imports\n"
            "with deferred_imports.deferred():\n"
            "    import sklearn\n"
            "    mcc = sklearn.metrics.accuracy_score\n"  # a name fairseq never binds: the real one
            "    real = sys.modules['sklearn.metrics']\n"
            "print(mcc.__module__, type(real).__name__, 'sklearn' in sys.modules)")
    assert _fresh(code).split() == ["sklearn.metrics._classification", "module", "True"]


@pytest.mark.parametrize("name", ["__path__", "__file__", "__all__"])
def test_a_stand_in_is_no_package_and_has_no_file(name):
    with pytest.raises(AttributeError):
        getattr(deferred_imports.DeferredModule("sklearn"), name)
