"""The translation studies' public names in one place (scripts and tests import them from
here); the code lives in ``realformer_tools.experiments.translation``: one module per study
(``compare``, ``lr_sweep``, ``depth``, ``ablation``, ``stability``) over shared modules
(``recipe``, ``runs``, ``stats``, ``report``)."""

from .translation.ablation import ablation_markdown, path_ablation, plot_ablation
from .translation.compare import compare, comparison_markdown, plot_comparison
from .translation.depth import depth_markdown, depth_stress, plot_depth
from .translation.lr_sweep import lr_sweep, plot_sweep, sweep_markdown
from .translation.recipe import (
    ABLATION,
    BACKBONE_DESCRIPTIONS,
    BACKBONES,
    CORPUS_NAMES,
    DEFAULT_CORPUS,
    DEPTH_BACKBONES,
    DEPTH_SIZE,
    LANGUAGE_NAMES,
    MAIN_ORDER,
    REPO,
    SIZES,
    USER_DIR,
    VARIANTS,
    Recipe,
    backbone_flags,
    corpus_info,
    eval_bleu_flags,
    max_len_a,
    test_references,
    train_command,
)
from .translation.report import write_outputs
from .translation.runs import (
    finished_run,
    machine_description,
    parallel_note,
    recipe_record,
    run_hypotheses,
    run_one,
    save_hypotheses,
)
from .translation.stability import (
    STABILITY_BACKBONES,
    STABILITY_LRS,
    plot_stability,
    stability_limit,
    stability_markdown,
)
from .translation.stats import (
    OUTCOMES,
    PAIRED_TEST_NOTE,
    add_seed_paired,
    classify,
    paired_bootstrap,
    paired_vs,
    seed_paired,
    summarize_backbone,
)

__all__ = [
    "ABLATION", "BACKBONE_DESCRIPTIONS", "BACKBONES", "CORPUS_NAMES", "DEFAULT_CORPUS", "DEPTH_BACKBONES",
    "DEPTH_SIZE", "LANGUAGE_NAMES", "MAIN_ORDER", "OUTCOMES", "PAIRED_TEST_NOTE", "REPO", "SIZES",
    "STABILITY_BACKBONES", "STABILITY_LRS", "USER_DIR", "VARIANTS", "Recipe", "ablation_markdown",
    "add_seed_paired", "backbone_flags", "classify", "compare", "comparison_markdown", "corpus_info",
    "depth_markdown", "depth_stress", "eval_bleu_flags", "finished_run", "lr_sweep", "machine_description",
    "max_len_a", "paired_bootstrap", "paired_vs", "parallel_note", "path_ablation", "plot_ablation",
    "plot_comparison", "plot_depth", "plot_stability", "plot_sweep", "recipe_record", "run_hypotheses", "run_one",
    "save_hypotheses", "seed_paired", "stability_limit", "stability_markdown", "summarize_backbone",
    "sweep_markdown", "test_references", "train_command", "write_outputs",
]
