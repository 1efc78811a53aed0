"""What ``import realformer_nmt`` changes in a process, measured (a script, run by
tests/test_import_changes_nothing.py in a fresh interpreter).

``python tests/import_snapshot.py host``: first imports what a fairseq command has loaded
when ``--user-dir`` loads the plugin (``fairseq_cli.train`` and the other fairseq CLIs,
the checkpoint, trainer and hub modules), then records every attribute (the object itself,
compared by identity) of every loaded module of ``fairseq``, ``fairseq_cli``, ``torch``
and ``numpy`` -- for a class defined in such a module, every entry of its ``__dict__``;
for a dict, list or set in a module's namespace, its items -- plus torch's weights-only
allow-list (``torch.serialization.get_safe_globals()``), ``sys.excepthook``, the root
logger's handlers and level, ``os.environ``, ``sys.path``, the warning filters and the
number of exit hooks. Then it imports ``realformer_nmt``, records the same again and
prints, as JSON, every difference that is not one of these:

* a module that was not loaded before (the plugin and what it imports);
* a new attribute that is a submodule imported since (``sys.modules`` has it under that name);
* a new entry of one of fairseq's registries (a dict or set whose name has ``REGISTRY`` or
  ``CLASS_NAMES``: ``ARCH_MODEL_REGISTRY``, ``TASK_REGISTRY``, ``CRITERION_REGISTRY``, the
  dataclass registries, ..., and every dict ``fairseq.registry.setup_registry`` made);
  an entry that was there must stay the same object.

``python tests/import_snapshot.py launcher``: the same measurement around the launcher's
``fixes_installed`` (every group of fixes) instead of the import: what changes inside the
block, and what is left changed after it.

``python tests/import_snapshot.py bare``: imports ``realformer_nmt`` and nothing before;
prints the root logger, the exit hook, the allow-list and the environment afterwards and
the ``fairseq*`` modules loaded, in order. ``python tests/import_snapshot.py fairseq
NAME...``: the same after importing only those modules (the plugin's own imports of
fairseq, without the plugin).
"""

import atexit
import importlib
import json
import logging
import os
import re
import sys
import warnings

HOST = ("fairseq_cli.train", "fairseq_cli.generate", "fairseq_cli.interactive", "fairseq_cli.validate",
        "fairseq_cli.eval_lm", "fairseq_cli.hydra_train", "fairseq_cli.preprocess", "fairseq.checkpoint_utils",
        "fairseq.trainer", "fairseq.hub_utils", "fairseq.distributed.utils", "fairseq.data.iterators",
        "fairseq.file_io")
WATCHED = ("fairseq", "fairseq_cli", "torch", "numpy")
GROWING = re.compile(r"REGISTRY|CLASS_NAMES")

_kept = []  # every recorded object stays alive, so that no id is reused by a new object


def _watched(name):
    return any(name == p or name.startswith(p + ".") for p in WATCHED)


def _key(value):
    return value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)


def _record(into, name, value):
    into[name] = id(value)
    _kept.append(value)


def _registries():
    """The ids of fairseq's registries made by ``registry.setup_registry`` (whatever name a
    module binds them to: ``fairseq.data.encoders`` calls its BPE dataclass registry ``_``)."""
    from fairseq import registry

    return {id(d) for entry in registry.REGISTRIES.values() for d in entry.values() if isinstance(d, dict)}


def snapshot():
    with warnings.catch_warnings():  # reading deprecated attributes (torch.distributed.reduce_op) warns
        warnings.simplefilter("ignore")
        return _snapshot()


def _snapshot():
    import torch

    attributes, growing, registries = {}, set(), _registries()
    for module_name, module in list(sys.modules.items()):
        if module is None or not _watched(module_name):
            continue
        for key, value in list(vars(module).items()):
            where = f"{module_name}:{key}"
            _record(attributes, where, value)
            if isinstance(value, type) and getattr(value, "__module__", None) == module_name:
                for class_key, class_value in list(vars(value).items()):
                    if class_key not in ("__dict__", "__weakref__"):
                        _record(attributes, f"{where}.{class_key}", class_value)
            elif isinstance(value, dict):
                if GROWING.search(key) or id(value) in registries:
                    growing.add(where)
                for item_key, item in list(value.items()):
                    _record(attributes, f"{where}[{_key(item_key)!r}]", item)
            elif isinstance(value, (list, set, frozenset, tuple)) and len(value) < 10_000:
                if GROWING.search(key) and isinstance(value, set):
                    growing.add(where)
                items = value if isinstance(value, (list, tuple)) else sorted(value, key=repr)
                for i, item in enumerate(items):
                    _record(attributes, f"{where}[{i if isinstance(value, (list, tuple)) else _key(item)!r}]",
                            item)
    root = logging.getLogger()
    return {
        "attributes": attributes,
        "growing": growing,
        "modules": set(sys.modules),
        "safe_globals": _names(torch.serialization.get_safe_globals()),
        "excepthook": id(sys.excepthook),
        "root_logger": ([id(h) for h in root.handlers], root.level),
        "environ": dict(os.environ),
        "sys.path": list(sys.path),
        "warning_filters": [repr(f) for f in warnings.filters],
        "exit_hooks": atexit._ncallbacks(),
    }


def grown(before, after):
    """The new entries of fairseq's registries."""
    return sorted(where for where in after["attributes"].keys() - before["attributes"].keys()
                  if where.split("[", 1)[0] in before["growing"])


def differences(before, after):
    changes = []
    old, new = before["attributes"], after["attributes"]
    for where, ident in old.items():
        if where not in new:
            changes.append(f"removed {where}")
        elif new[where] != ident:
            changes.append(f"replaced {where}")
    for where in new.keys() - old.keys():
        module_name = where.split(":", 1)[0]
        if module_name not in before["modules"] or where.split("[", 1)[0] in before["growing"]:
            continue
        attribute = where.split(":", 1)[1]
        if re.fullmatch(r"\w+", attribute) and f"{module_name}.{attribute}" in sys.modules \
                and f"{module_name}.{attribute}" not in before["modules"]:
            continue  # a submodule imported since
        changes.append(f"added {where}")
    for name in ("safe_globals", "excepthook", "root_logger", "environ", "sys.path", "warning_filters",
                 "exit_hooks"):
        if before[name] != after[name]:
            changes.append(f"changed {name}: {before[name]!r} -> {after[name]!r}"[:500])
    return sorted(changes)


def _names(safe_globals):
    """torch's allow-list as sorted names (an entry is an object or ``(object, name)``)."""
    return sorted(entry[1] if isinstance(entry, tuple) else
                  f"{getattr(entry, '__module__', '')}.{getattr(entry, '__qualname__', repr(entry))}"
                  for entry in safe_globals)


def outside_state(loaded):
    import torch

    root = logging.getLogger()
    return {
        "root_logger": {"level": root.level,
                        "handlers": [(type(h).__name__, h.level, getattr(getattr(h, "stream", None), "name", None),
                                      getattr(h.formatter, "_fmt", None)) for h in root.handlers]},
        "excepthook_is_pythons": sys.excepthook is sys.__excepthook__,
        "safe_globals": _names(torch.serialization.get_safe_globals()),
        "environ": dict(os.environ),
        "exit_hooks": atexit._ncallbacks(),
        "numpy_names": sorted(vars(sys.modules["numpy"])),
        "fairseq_modules": loaded,
    }


def main(argv):
    if argv[0] == "host":
        for name in HOST:
            importlib.import_module(name)
        before = snapshot()
        import realformer_nmt  # noqa: F401

        after = snapshot()
        print(json.dumps({"changes": differences(before, after), "registered": grown(before, after),
                          "new_modules": sorted(after["modules"] - before["modules"])}))
    elif argv[0] == "launcher":
        for name in HOST:
            importlib.import_module(name)
        import realformer_nmt  # noqa: F401
        from realformer_tools.launch import fixes_installed

        before = snapshot()
        with fixes_installed(data_fixes=True, bf16_decoding=True, every_sentence=True, quiet=True):
            inside = snapshot()
        after = snapshot()
        print(json.dumps({"inside": differences(before, inside), "after": differences(before, after)}))
    elif argv[0] == "bare":
        import realformer_nmt  # noqa: F401

        loaded = [m for m in sys.modules if m == "fairseq" or m.startswith(("fairseq.", "fairseq_cli"))]
        print(json.dumps(outside_state(loaded)))
    else:  # "fairseq" NAME...
        for name in argv[1:]:
            importlib.import_module(name)
        loaded = [m for m in sys.modules if m == "fairseq" or m.startswith(("fairseq.", "fairseq_cli"))]
        print(json.dumps(outside_state(loaded)))


if __name__ == "__main__":
    main(sys.argv[1:])
