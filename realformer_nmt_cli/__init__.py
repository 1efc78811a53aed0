"""The command-line tools of realformer-nmt: one module per command, each with
``main(argv=None)`` (and ``parse_args(argv)`` where the flags need checks of their own).

The wheel installs them as console commands (``realformer-prepare-data``, ...; the list is
``setup.py``'s ``entry_points``), and ``scripts/<name>.py`` in a checkout runs the same
``main``. A separate top-level package, like fairseq's own ``fairseq_cli`` beside
``fairseq``: importing ``realformer_nmt`` imports fairseq and registers the plugin (seconds),
so each command parses its flags, and answers ``--help``, before it imports that.
"""
