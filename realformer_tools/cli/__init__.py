"""The command-line tools of realformer-nmt: one module per command, each with
``main(argv=None)`` (and ``parse_args(argv)`` where the flags need checks of their own).

The wheel installs them as console commands (``realformer-prepare-data``, ...; the list is
``setup.py``'s ``entry_points``), and ``scripts/<name>.py`` in a checkout runs the same
``main``. It lives inside the plugin package (the project's top-level layout is fixed), so
importing a command imports ``realformer_nmt`` and with it fairseq: ``--help`` takes the
seconds that import takes.
"""
