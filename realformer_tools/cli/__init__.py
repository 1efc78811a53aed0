"""The command-line tools of realformer-nmt: one module per command, each with
``main(argv=None)`` (and ``parse_args(argv)`` where the flags need checks of their own).

The wheel installs them as console commands (``realformer-prepare-data``, ...; the list is
``setup.py``'s ``entry_points``), and ``scripts/<name>.py`` in a checkout runs the same
``main``. Importing a command imports the plugin (``realformer_tools/__init__.py`` imports
it first) and with it fairseq: ``--help`` takes the seconds that import takes.
"""
