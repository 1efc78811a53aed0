"""Translation studies over one shared harness.

Shared modules: ``recipe`` (backbones, the shared recipe, the corpus), ``runs`` (one run,
many at once, the records every study stores), ``stats`` (summaries over seeds, outcomes,
paired tests) and ``report`` (JSON, Markdown, PNG). One module per study: ``compare``
(the main comparison), ``lr_sweep`` (learning-rate stability), ``depth`` (depth stress),
``ablation`` (which residual path matters).
"""
