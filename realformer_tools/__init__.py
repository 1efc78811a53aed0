"""The tools around the RealFormer plugin (``realformer_nmt``): everything a user runs
around the model, none of which ``--user-dir realformer_nmt`` loads.

``launch`` the ``realformer-fairseq`` launcher (a fairseq command with the fixes to
fairseq 0.12), ``fairseq_fixes/`` those fixes (one module per bug), ``cli/`` the console
commands (``scripts/`` wrap them), ``data/`` corpus preparation, ``experiments/``
benchmarks, comparisons, attention analysis and the GPU check, ``convert/`` Google's
RealFormer checkpoints, ``hf/`` the Hugging Face export and its self-contained modeling
files. The tools import the plugin; the plugin never imports them.
"""
