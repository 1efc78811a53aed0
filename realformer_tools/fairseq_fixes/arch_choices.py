"""A mistyped ``--arch`` is one line naming the closest registered architectures, not
fairseq's whole usage.

Bug (fairseq 0.12): ``options.add_model_args`` gives ``--arch`` every registered
architecture as argparse ``choices``; a typo (``--arch realformer_transfomer``) prints the
training parser's usage and a list of all ~280 names: 116 lines, 4,000 characters, none
of them saying which name was meant.

Fix: ``options.add_model_args`` is wrapped (fairseq-train builds its parser after
``--user-dir`` loaded the plugin) so that ``--arch``'s choices are :class:`ArchChoices`:
the same registered names, whose membership test raises a
:class:`~realformer_nmt.errors.FlagValueError` (printed as one line, exit status 2, as
argparse's usage errors) for a name that is not registered, with up to three suggestions
(names that start with or contain it first, their family names before the variants, then
``difflib``'s close matches; a few common names when none is close). A registered
name passes exactly as before (argparse stores the string), and ``--help`` is unchanged
(``--arch`` shows its metavar ``ARCH``). Without the fixes (fairseq's own command, not
through the launcher), with or without ``--user-dir``, fairseq prints its own usage (exit
status 2).

When it is no longer needed: ``fairseq-train DATA --arch transfomer`` prints one line
with the patch uninstalled.
"""

import difflib
import functools

from fairseq import options
from fairseq.models import ARCH_MODEL_REGISTRY

from realformer_nmt.errors import FlagValueError

_FIXED = "__realformer_fixed__"
EXAMPLES = ("transformer", "roberta", "realformer_transformer", "realformer_bert")  # named when nothing is close


def suggestions(name, registered, n=3):
    """Up to ``n`` registered names for a name that is not one, best first.

    Names that start with it (given two characters or more), then names that contain it (three
    or more; case ignored, ``-`` read as ``_``), each group with its family names first, those
    that extend no other match (``realformer`` -> ``realformer_transformer`` and
    ``realformer_bert`` before ``realformer_bert_base``); then ``difflib``'s close matches
    (typos: ``transfomer`` -> ``transformer``)."""
    key = name.lower().replace("-", "_")

    def similarity(arch):
        return -difflib.SequenceMatcher(None, key, arch.lower()).ratio(), arch

    prefix = [a for a in registered if len(key) >= 2 and a.lower().startswith(key)]
    inside = [a for a in registered if len(key) >= 3 and key in a.lower() and a not in prefix]
    ranked = []
    for group in (prefix, inside):
        families = [a for a in group if not any(a != b and a.startswith(b + "_") for b in group)]
        ranked += sorted(families, key=similarity) + sorted(set(group) - set(families), key=similarity)
    ranked += difflib.get_close_matches(name, registered, n=n, cutoff=0.6)
    return list(dict.fromkeys(ranked))[:n]


class ArchChoices:
    """``ARCH_MODEL_REGISTRY``'s names as argparse choices, refusing an unknown one in one line."""

    def __iter__(self):
        return iter(ARCH_MODEL_REGISTRY.keys())

    def __len__(self):
        return len(ARCH_MODEL_REGISTRY)

    def __contains__(self, name):
        if name in ARCH_MODEL_REGISTRY:
            return True
        close = suggestions(str(name), list(ARCH_MODEL_REGISTRY))
        examples = [a for a in EXAMPLES if a in ARCH_MODEL_REGISTRY]
        hint = (f"did you mean {', '.join(close)}?" if close else
                f"none of the {len(ARCH_MODEL_REGISTRY)} registered names is close (e.g. {', '.join(examples)})")
        raise FlagValueError(f"--arch {name!r} is not a registered architecture: {hint}")


def arch_choices_with_suggestions(add_model_args):
    @functools.wraps(add_model_args)
    def wrapper(parser, *args, **kwargs):
        group = add_model_args(parser, *args, **kwargs)
        for action in parser._actions:  # argparse keeps the actions of every group here
            if "--arch" in action.option_strings and action.choices is not None:
                action.choices = ArchChoices()
        return group

    setattr(wrapper, _FIXED, True)
    return wrapper


# what install() replaces (module:attribute, as fairseq looks it up) and what that changes, for the
# launcher's log line and its restoring (realformer_tools.fairseq_fixes.fixes_installed)
REPLACES = (
    "fairseq.options:add_model_args",
)
CHANGES = ("a mistyped --arch is one line naming the closest registered names")


def install():
    if not getattr(options.add_model_args, _FIXED, False):
        options.add_model_args = arch_choices_with_suggestions(options.add_model_args)


def uninstall():
    """Restore fairseq's own function (tests use this to see what fairseq does alone)."""
    if getattr(options.add_model_args, _FIXED, False):
        options.add_model_args = options.add_model_args.__wrapped__
