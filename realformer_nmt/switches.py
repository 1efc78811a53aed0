"""The names of the two switches that turn the fixes to fairseq on, and how they are read.

A leaf module: it imports nothing of the tools, so the tools' fixes
(``realformer_tools.fairseq_fixes``) and the plugin's switch module
(:mod:`realformer_nmt.fairseq_fixes_switch`, which imports those fixes only when a switch asks)
both read the names from here, and their imports form no circle.
"""

import os

from .errors import ConfigError, install_excepthook

FIXES_SWITCH = "REALFORMER_NMT_FAIRSEQ_FIXES"
DATA_FIXES_SWITCH = "REALFORMER_NMT_DATA_FIXES"
_MEANING = {FIXES_SWITCH: "the fixes to fairseq installed", DATA_FIXES_SWITCH: "fairseq's data handling fixed"}


def asked(name, environ=None) -> bool:
    """Whether the switch ``name`` is ``1``; unset, empty or ``0`` is no. Any other value is
    refused with one line (a switch was set, so the one-line error hook is installed first)."""
    value = (os.environ if environ is None else environ).get(name, "").strip()
    if value not in ("", "0", "1"):
        install_excepthook()
        raise ConfigError(f"{name}={value!r}: set it to 1 ({_MEANING[name]}) or 0 / leave it unset (fairseq's own)")
    return value == "1"


def with_fixes(env, data_fixes=False):
    """A copy of the environment ``env`` for a child fairseq tool, with the fixes switched on
    (and the data fixes, when ``data_fixes``)."""
    env = dict(env, **{FIXES_SWITCH: "1"})
    if data_fixes:
        env[DATA_FIXES_SWITCH] = "1"
    return env
