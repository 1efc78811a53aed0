"""The one switch that installs the fixes to fairseq 0.12 in plain fairseq runs.

Importing the plugin (``import realformer_nmt``, ``--user-dir realformer_nmt``) registers
the models, tasks and criterions and changes nothing else: no fairseq function, no torch
allow-list, no ``sys.excepthook``, no logging, no environment variable. The fixes to
fairseq itself (``realformer_tools.fairseq_fixes``, in the tools package: safe checkpoint loading, atomic
checkpoint copies, one-line errors, ``--bf16`` on CPU, ...) are opt-in:

* the project's own commands (the demo, the comparison harnesses, the GPU check, the CLIs)
  install them in their own process and set :data:`FIXES_SWITCH` for every fairseq tool
  they start;
* in a plain fairseq run, ``REALFORMER_NMT_FAIRSEQ_FIXES=1`` (:data:`FIXES_SWITCH`), read
  when the plugin is imported, installs the always-on fixes, and
  ``REALFORMER_NMT_DATA_FIXES=1`` (:data:`DATA_FIXES_SWITCH`) the three fixes that change
  what fairseq trains on and scores (kept last batch, masks redrawn per epoch with
  workers, a resumed run's batches as if never stopped). ``1`` turns a group on; unset,
  empty or ``0`` leaves fairseq as it is;
* a program calls :func:`install_fairseq_fixes`.

Only then is the fixes package imported. docs/reliability.md lists the fixes and which of
them change a number fairseq computes alone.
"""

from .switches import DATA_FIXES_SWITCH, FIXES_SWITCH, asked, with_fixes  # noqa: F401  (defined there)


def install_fairseq_fixes(data_fixes=None):
    """Install the always-on fixes to fairseq, and the data fixes when ``data_fixes`` (None:
    as :data:`DATA_FIXES_SWITCH` says) asks for them. Idempotent."""
    from realformer_tools import fairseq_fixes as fairseq_patches  # the one import of the tools, only when asked

    fairseq_patches.install_all(data_fixes=data_fixes)


def install_asked(environ=None):
    """What importing the plugin does about the fixes: install the groups the switches ask for."""
    fixes, data_fixes = asked(FIXES_SWITCH, environ), asked(DATA_FIXES_SWITCH, environ)
    if not (fixes or data_fixes):
        return
    from realformer_tools import fairseq_fixes as fairseq_patches  # the one import of the tools, only when asked

    if fixes:
        fairseq_patches.install_always_on()
    if data_fixes:
        fairseq_patches.install_data_fixes()
