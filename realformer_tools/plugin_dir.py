"""Where the plugin is: the folder of the ``realformer_nmt`` package that this Python
imports (an installed wheel's or a checkout's), the value of fairseq's ``--user-dir``.
Found from the import system's search, not from where this file lies."""

import importlib.util
import os


def plugin_dir() -> str:
    spec = importlib.util.find_spec("realformer_nmt")
    if spec is None or not spec.origin:
        raise ImportError("the realformer_nmt package (the plugin) is not installed beside realformer_tools")
    return os.path.dirname(os.path.abspath(spec.origin))
