"""The per-layer summary (medians pooled over heads, per model), its markdown table with
the own-score control explained, and the JSON writer of the results."""

import json
import math
import os
import re
from typing import Dict, List, Sequence

from .. import fairseq_runs
from .analysis import Analysis
from .estimators import BIN_WIDTH
from .histograms import _none_for_nan
from .recording import ATTENTION_TYPES

SUMMARY_KEYS = ("entropy_median", "jsd_median", "own_entropy_median", "own_jsd_median")


def layer_summary(analyses: Sequence[Analysis]) -> Dict[str, List[dict]]:
    """Per type and layer: median entropy over all heads and tokens of the layer, and
    median JSD between the layer and the one below (pooled over heads), per model; of
    the attention used (``entropy_median``, ``jsd_median``) and of the layers' own scores
    (``own_entropy_median``, ``own_jsd_median``), and ``own_max_abs_difference``."""
    out = {}
    types = [t for t in ATTENTION_TYPES if any(t in a.types for a in analyses)]
    for t in types:
        rows = []
        layers = max(a.types[t].layers for a in analyses if t in a.types)
        for layer in range(layers):
            row = {"layer": layer + 1, **{k: [] for k in SUMMARY_KEYS}, "own_max_abs_difference": []}
            for a in analyses:
                s = a.types.get(t)
                values = dict.fromkeys(SUMMARY_KEYS)
                difference = None
                if s is not None and layer < s.layers:
                    difference = round(float(s.own_difference[layer]), 6)
                    for source, prefix in (("used", ""), ("own", "own_")):
                        ent = s.histogram("entropy", source).pooled(range(layer * s.heads, (layer + 1) * s.heads))
                        values[f"{prefix}entropy_median"] = float(ent.median()[0])
                        if layer >= 1:
                            pair = range((layer - 1) * s.heads, layer * s.heads)
                            values[f"{prefix}jsd_median"] = float(s.histogram("jsd", source).pooled(pair).median()[0])
                for k in SUMMARY_KEYS:
                    row[k].append(_none_for_nan(values[k]))
                row["own_max_abs_difference"].append(difference)
            rows.append(row)
        out[t] = rows
    return out


CONTROL_NOTE = (
    "Control (own scores). A RealFormer layer n > 1 attends with softmax(mask(A_n / c_n)), "
    "A_n = A_{n-1} + S_n, S_n = Q_n K_n^T / sqrt(d): its attention contains the layers below by "
    "construction, so adjacent layers are partly alike, and summed logits are sharper, whatever was learned. "
    "The `own` columns are the same statistics of softmax(mask(S_n)), each layer's own scores with the "
    "layer's masks and no residual sum. A low own-score JSD (or entropy) is learned: the layers' own "
    "queries and keys agree (or are sharp); what the used columns show beyond the own ones is "
    "contributed by the residual sum. For fairseq's own attention (Post-LN, Pre-LN, a path set to none) "
    "and for the first layer of a RealFormer path the own scores are the attention used "
    "(`own_max_abs_difference` = 0 in run.json), so there the control equals the measurement."
)


def summary_markdown(analyses: Sequence[Analysis], summary: Dict[str, List[dict]]) -> str:
    def fmt(v):
        return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"

    lines = ["Median attention entropy of each layer and median JSD between the layer and the one "
             "below (same head), over all heads and real query tokens; natural log "
             f"(medians within {BIN_WIDTH} nats). `entropy`, `JSD`: the attention each layer uses; "
             "`own entropy`, `own JSD`: the same of each layer's own scores (the control below).", ""]
    names = list("AB") if len(analyses) > 1 else [""]
    for i, a in enumerate(analyses):
        lines.append(f"- {names[i] or 'model'}: {a.label}, `{a.checkpoint}`, {a.sentences} sentences")
    lines += ["", CONTROL_NOTE]
    for t, rows in summary.items():
        lines += ["", f"### {t}", ""]
        head = ["layer"] + [f"{what} {x}".strip() for what in ("entropy", "own entropy", "JSD", "own JSD")
                            for x in names]
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + " --- |" * len(head))
        for row in rows:
            cells = [str(row["layer"])] + [fmt(v) for k in ("entropy_median", "own_entropy_median", "jsd_median",
                                                              "own_jsd_median") for v in row[k]]
            lines.append("| " + " | ".join(cells) + " |")
        same = [names[i] or "The model" for i in range(len(analyses))
                if all(r["own_max_abs_difference"][i] in (0.0, None) for r in rows)]
        if same:
            lines += ["", f"{', '.join(same)}: own scores are the attention used in every layer "
                      "(largest difference 0), so own = used there."]
    return "\n".join(lines) + "\n"


def write_json(path: str, obj) -> None:
    """Indented JSON with each innermost list of numbers on one line; atomic. Paths inside
    the repository are written relative to it."""
    text = json.dumps(fairseq_runs.portable(obj), indent=1, allow_nan=False)
    text = re.sub(r"\[\s*([^\[\]{}\"]*?)\s*\]", lambda m: "[" + re.sub(r"\s+", " ", m.group(1)) + "]", text)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text + "\n")
    os.replace(tmp, path)
