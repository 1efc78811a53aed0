"""scikit-learn and scipy.stats imported when a fairseq 0.12 function that needs them is first
called, not when fairseq starts: a helper of the launcher (not one of the fixes in
``fairseq_fixes``, which import fairseq) that changes no number.

fairseq 0.12 imports every task and criterion when it starts, and two of them import these
libraries at the top for functions only they call: ``criterions/sentence_prediction.py``
(``f1_score`` and ``matthews_corrcoef`` from ``sklearn.metrics``, ``pearsonr`` and
``spearmanr`` from ``scipy.stats``: GLUE's scores) and ``tasks/audio_classification.py``
(``from sklearn import metrics``). scikit-learn in turn imports scipy, pandas, narwhals and rich:
with them ``python -m realformer_tools.launch fairseq-generate --help`` took 4.2-4.4 s on the
2-core development machine, without them 3.0-3.1 s (five runs each, alternating), paid by every
launched command and every decode of the comparison harness. (Not by the ranks that
``torch.multiprocessing.spawn`` starts: they import fairseq while unpickling their function,
before the launcher's code runs.)

:func:`deferred` is the block in which the launcher imports the fairseq command. In it
``sklearn``, ``sklearn.metrics`` and ``scipy.stats`` are stand-ins in ``sys.modules``: the
functions fairseq binds by name are stand-ins that call the library's own, importing it then,
and the ``metrics`` module it binds imports scikit-learn when an attribute is looked up. After
the block the stand-ins leave ``sys.modules``: a later ``import sklearn`` or ``scipy.stats`` (a
user's ``--user-dir`` module, say) imports the real one. The block does nothing where one of them
or fairseq is imported already (a program that calls the launcher's ``main``); the libraries
compute every score. What differs: the first call pays the import (the first validation of a
``sentence_prediction`` run with ``--report-mcc`` and friends logs a lower ``wps``), and the
functions fairseq bound stay stand-ins for the life of the process (``pickle`` refuses them as
not scikit-learn's own object; fairseq never pickles them). When fairseq no longer imports
these libraries at start-up, the block has nothing to defer and can go.
"""

import contextlib
import importlib
import sys
import types

# module -> the names fairseq 0.12 imports from it (criterions/sentence_prediction.py)
FUNCTIONS = {"sklearn.metrics": ("f1_score", "matthews_corrcoef"), "scipy.stats": ("pearsonr", "spearmanr")}
STAND_INS = ("sklearn", *FUNCTIONS)  # and the package tasks/audio_classification.py imports metrics from


class DeferredModule(types.ModuleType):
    """Stands in for a module: an attribute lookup imports the real module (after taking every
    stand-in out of ``sys.modules``) and returns the real attribute."""

    def __getattr__(self, name):
        if name.startswith("__"):  # what the import system probes (__path__: not a package) and tools
            raise AttributeError(name)
        return getattr(real(self.__name__), name)


def real(name):
    """The real module ``name``, imported now if need be."""
    for module in STAND_INS:
        if isinstance(sys.modules.get(module), DeferredModule):
            del sys.modules[module]
    return importlib.import_module(name)


def deferred_function(module, name):
    """A function that calls ``module``'s ``name``, importing ``module`` on its first call."""

    def call(*args, **kwargs):
        return getattr(real(module), name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__module__ = module
    call.__doc__ = f"{module}.{name}, imported when first called (realformer_tools.deferred_imports)"
    return call


@contextlib.contextmanager
def deferred():
    """A block in which importing fairseq imports neither scikit-learn nor scipy.stats (see the
    module's docstring)."""
    if any(name in sys.modules for name in (*STAND_INS, "fairseq")):
        yield
        return
    stand_ins = {name: DeferredModule(name) for name in STAND_INS}
    for module, names in FUNCTIONS.items():
        for name in names:
            setattr(stand_ins[module], name, deferred_function(module, name))
    stand_ins["sklearn"].metrics = stand_ins["sklearn.metrics"]
    sys.modules.update(stand_ins)
    try:
        yield
    finally:
        for name, stand_in in stand_ins.items():
            if sys.modules.get(name) is stand_in:
                del sys.modules[name]
