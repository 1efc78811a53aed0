"""The tools around the RealFormer plugin (``realformer_nmt``): everything a user runs
around the model, none of which ``--user-dir realformer_nmt`` loads.

``cli/`` the console commands (``scripts/`` wrap them), ``fairseq_fixes/`` fixes to
fairseq 0.12 itself (one module per bug), ``data/`` corpus preparation, ``experiments/``
benchmarks, comparisons, attention analysis and the GPU check, ``convert/`` Google's
RealFormer checkpoints, ``hf/`` the Hugging Face export and its self-contained modeling
files. The tools import the plugin; the plugin never imports them.
"""

# The plugin first: its __init__ installs the fixes (fairseq_fixes), whose modules import the
# plugin's errors; a tools module imported before the plugin would meet a half-imported
# fairseq_fixes there. Not needed once importing the plugin installs nothing (issue 48 §1).
import realformer_nmt  # noqa: F401
