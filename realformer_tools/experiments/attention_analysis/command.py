"""``analyze_and_report``: what ``scripts/analyze_attention.py`` runs: one or two
checkpoints analysed (resumably), then the JSON, the figures, ``summary.md`` and
``run.json`` written into one folder."""

import os
from typing import Optional, Sequence

from .analysis import Log, analyze_checkpoint
from .estimators import STATISTICS
from .plots import plot_violins
from .recording import ATTENTION_TYPES
from .report import layer_summary, summary_markdown, write_json


def analyze_and_report(
    path: str,
    data: str,
    out: str,
    compare: Optional[str] = None,
    subset: str = "test",
    max_sentences: Optional[int] = None,
    batch_size: int = 32,
    max_tokens: int = 8192,
    device: str = "cpu",
    mlm_input: str = "original",
    labels: Sequence[Optional[str]] = (None, None),
    force: bool = False,
    save_every: float = 60.0,
    log: Log = print,
) -> dict:
    """Analyse ``path`` (and ``compare``) and write into ``out``: ``attention_stats.json``
    (``attention_stats_compare.json``), one PNG per attention type and statistic
    (``<type>_entropy.png``, ``<type>_jsd.png``, both models side by side with
    ``compare``; ``<type>_entropy_own_scores.png``, ``<type>_jsd_own_scores.png`` the same
    for the layers' own scores), ``summary.md`` and ``run.json``. Progress lives in
    ``out/state_*.npz``: re-running resumes (``force`` starts over). Returns the paths
    written and the per-layer summary."""
    os.makedirs(out, exist_ok=True)
    checkpoints = [("path", path)] + ([("compare", compare)] if compare else [])
    analyses = []
    for (tag, ckpt), label in zip(checkpoints, labels):
        state = os.path.join(out, f"state_{tag}.npz")
        if force and os.path.exists(state):
            os.remove(state)
        analyses.append(analyze_checkpoint(
            ckpt, data, subset=subset, max_sentences=max_sentences, batch_size=batch_size,
            max_tokens=max_tokens, device=device, mlm_input=mlm_input, state_path=state,
            save_every=save_every, label=label, log=log,
        ))
    if len(analyses) == 2 and analyses[0].label == analyses[1].label:
        for a, suffix in zip(analyses, ("(--path)", "(--compare)")):
            a.label = f"{a.label} {suffix}"

    written = {"json": [], "png": []}
    for (tag, _), a in zip(checkpoints, analyses):
        name = "attention_stats.json" if tag == "path" else "attention_stats_compare.json"
        write_json(os.path.join(out, name), a.to_json())
        written["json"].append(os.path.join(out, name))
    for t in ATTENTION_TYPES:
        for stat in STATISTICS:
            for source, suffix in (("used", ""), ("own", "_own_scores")):
                png = os.path.join(out, f"{t}_{stat}{suffix}.png")
                if plot_violins(analyses, t, stat, png, source):
                    written["png"].append(png)
    summary = layer_summary(analyses)
    markdown = summary_markdown(analyses, summary)
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(markdown)
    write_json(os.path.join(out, "run.json"), {
        "models": [a.details() for a in analyses], "layer_summary": summary,
        "figures": [os.path.basename(p) for p in written["png"]],
    })
    written["summary"] = os.path.join(out, "summary.md")
    written["markdown"] = markdown
    written["layer_summary"] = summary
    return written
