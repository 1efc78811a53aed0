"""``summary.md``: the ``--quick`` part (from ``quick.json``) and the full check's part
(from the steps' JSON, the speed tables and the kernel rule), with the targets."""

from .. import fairseq_runs
from .records import status_counts
from .settings import QUICK_SECTIONS, STEPS
from .targets import loss_targets, speed_targets


def _verdict(met, status=None):
    if met is None:
        return f"not measured ({status})" if status else "not measured"
    return "met" if met else "not met"


def _fmt(x, digits=2):
    return "-" if x is None else f"{x:.{digits}f}"


def _cell(text) -> str:
    return str(text).replace("|", "/").replace("\n", " ")


def _run_cells(c):
    """A training run's ``(status, first / last train loss, decode)`` table cells."""
    losses = c.get("train_losses") or []
    first_last = f"{_fmt(losses[0][1], 3)} / {_fmt(losses[-1][1], 3)}" if losses else "-"
    generate = c.get("generate") or {}
    decode = generate.get("bleu_line") or generate.get("reason") or "-"
    status = c["status"] + (f": {c['reason']}" if c.get("reason") else "")
    return _cell(status), first_last, _cell(decode)


def _e(x):
    return "-" if x is None else f"{x:.1e}"


def _tensor(name):
    return "-" if not name else f"`{name}`"


def exactness_lines(checks):
    """The exactness section's tables (also for a rejudged run: its old checks are listed
    as superseded)."""
    lines = []
    proof = [c for c in checks if "float64 proof" in c["name"] or "vs materialized float64" in c["name"]]
    if proof:
        lines += ["", "### the mathematics in float64 (each kernel against materialized, relative error <= 1e-10)", "",
                  "| check | status | output | worst gradient | note |", "| --- | --- | --- | --- | --- |"]
        for c in proof:
            lines.append(f"| {c['name']} | {c['status']} | {_e(c.get('output_relative'))} | "
                         f"{_e(c.get('max_relative'))} | {_cell(c.get('reason') or '')} |")
    judged = [c for c in checks if "limit_output" in c]
    yard = [c for c in checks if c.get("reason") == "yardstick"]
    if judged or yard:
        lines += ["", "### float32 against float64, judged by yardsticks measured in the same run", "",
                  "A kernel passes when its output and its worst parameter tensor are each at most 2x the larger "
                  "yardstick (materialized's own distance, fairseq's own attention's) + 1e-6 from float64.", "",
                  "| check | status | output (limit) | worst gradient (limit) | worst tensor | ReLU flips "
                  "(materialized) | note |", "| --- | --- | --- | --- | --- | --- | --- |"]
        for c in yard:
            flips = "-" if c.get("relu_flips") is None else str(c["relu_flips"])
            lines.append(f"| {c['name']} | yardstick | {_e(c.get('output_relative'))} | {_e(c.get('max_relative'))} | "
                         f"{_tensor(c.get('worst_tensor'))} | {flips} | |")
        for c in judged:
            flips = "-" if c.get("relu_flips") is None else f"{c['relu_flips']} ({c.get('materialized_relu_flips')})"
            lines.append(f"| {c['name']} | {c['status']} | {_e(c.get('output_relative'))} ({_e(c['limit_output'])}) | "
                         f"{_e(c.get('max_relative'))} ({_e(c['limit_gradient'])}) | "
                         f"{_tensor(c.get('worst_tensor'))} | {flips} | {_cell(c.get('reason') or '')} |")
    other_kernel_rows = [c for c in checks if c.get("status") in ("reported", "failed") and c.get("model")
                         and "limit_output" not in c and c.get("reason") != "yardstick" and "distances" not in c
                         and "float64" in c["name"] and "vs materialized float64" not in c["name"]]
    for c in other_kernel_rows:
        lines.append(f"- {c['name']}: {c['status']} ({c.get('reason')})")
    halves = [c for c in checks if "distances" in c]
    if halves:
        kernels = []
        for c in halves:
            kernels += [k for k in c["distances"] if k not in kernels]
        lines += ["", "### half precision against float64 (reported: output / worst gradient)", "",
                  "| precision | model, mode | " + " | ".join(kernels) + " |",
                  "| --- | --- | " + " | ".join("---" for _ in kernels) + " |"]
        for c in halves:
            cells = [f"{_e(c['distances'][k]['output'])} / {_e(c['distances'][k]['gradient'])}"
                     if k in c["distances"] else "-" for k in kernels]
            lines.append(f"| {c['dtype']} | {c['model']}, {c['mode']} | " + " | ".join(cells) + " |")
    old = [c for c in checks if " vs materialized (" in c["name"] and "max_relative" in c]
    if old:
        lines += ["", "### float32 kernel against float32 materialized (the first yardstick, 1e-4)", "",
                  "| check | status | max relative error | worst tensor | note |", "| --- | --- | --- | --- | --- |"]
        for c in old:
            lines.append(f"| {c['name']} | {c['status']} | {_e(c['max_relative'])} | `{c['worst_tensor']}` | "
                         f"{_cell(c.get('reason') or '')[:200]} |")
    layer = [c for c in checks if "relative_errors" in c or "forward" in c]
    if layer:
        lines += ["", "### one bias layer", "", "| check | status | measured |", "| --- | --- | --- |"]
        for c in layer:
            if "relative_errors" in c:
                what = ", ".join(f"{k} {v:.1e}" for k, v in c["relative_errors"].items())
            else:
                what = f"forward {', '.join(c['forward']['backends'])}; backward {', '.join(c['backward']['backends'])}"
            lines.append(f"| {c['name']} | {c['status']} | {what} |")
    cut = [c for c in checks if c["name"].startswith("exactness: ") and c["name"] != "exactness: the float64 proof"]
    for c in cut:
        lines.append(f"- {c['name']}: {c['status']} ({c.get('reason')})")
    return lines


def train_lines(checks):
    lines = ["", "| precision | kernel | seed | status | updates | first / last train loss | valid loss | decode |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    runs = [c for c in checks if "precision" in c and "kernel" in c and "shift" not in c and "relative" not in c
            and "vanilla_gaps" not in c]
    for c in runs:
        if c["status"] == "skipped":
            lines.append(f"| {c.get('precision')} | {c.get('kernel')} | {c.get('seed', 1)} | skipped: "
                         f"{_cell(c.get('reason'))} | | | | |")
            continue
        status, first_last, decode = _run_cells(c)
        lines.append(f"| {c.get('precision')} | {c.get('kernel')} | {c.get('seed', 1)} | {status} | "
                     f"{c.get('updates', '-')} | {first_last} | {_fmt(c.get('valid_loss'), 3)} | {decode} |")
    shifts = [c for c in checks if "shift" in c]
    if shifts:
        lines += ["", "Precision cost, judged: each fp32 checkpoint evaluated in fp16 / bf16 (valid nll, base 2); a "
                  "kernel's shift within max(0.5%, 1.5x vanilla's).", "",
                  "| precision | kernel | status | fp32 nll | nll | shift | limit |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for c in shifts:
            status = "yardstick" if c["kernel"] == "vanilla" else c["status"]
            limit = "-" if c.get("limit") is None else f"{100 * c['limit']:.3f}%"
            lines.append(f"| {c['dtype']} | {c['kernel']} | {status} | {c['fp32_nll']:.4f} | {c['nll']:.4f} | "
                         f"{100 * c['shift']:.3f}% | {limit} |")
    gaps = [c for c in checks if "vanilla_gaps" in c]
    if gaps:
        lines += ["", "| precision gap over seeds | status | kernel mean | vanilla mean | difference | 2 SE |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for c in gaps:
            def pct(x):
                return "-" if x is None else f"{100 * x:+.2f}%"
            two_se = "-" if c.get("se") is None else f"{200 * c['se']:.2f}%"
            lines.append(f"| {c['name']} | {c['status']} | {pct(c.get('kernel_mean'))} | {pct(c.get('vanilla_mean'))} "
                         f"| {pct(c.get('mean'))} | {two_se} |")
    rest = [c for c in checks if "relative" in c and "fp32_valid_loss" in c]
    if rest:
        lines += ["", "| trained in half precision (reported) | status | valid loss | fp32 valid loss | difference |",
                  "| --- | --- | --- | --- | --- |"]
        for c in rest:
            diff = "-" if c.get("relative") is None else f"{100 * c['relative']:.2f}%"
            lines.append(f"| {c['name']} | {_cell(c['status'])} | {_fmt(c.get('valid_loss'), 3)} | "
                         f"{_fmt(c.get('fp32_valid_loss'), 3)} | {diff} |")
    for c in checks:
        if c not in runs and "shift" not in c and "relative" not in c and "vanilla_gaps" not in c:
            lines.append(f"- {c['name']}: {c['status']} ({c.get('reason')})")
    return lines


def speed_lines(checks):
    lines = []
    table = next((c.get("table") for c in checks if c.get("table")), None)
    if table:
        lines += ["| size | T | variant | train tok/s | x vanilla: median (range, rounds) | peak MiB | x vanilla |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for r in table:
            spread = (f" ({_fmt(r['train_speed_low'])}-{_fmt(r['train_speed_high'])}, {r['rounds']})"
                      if r.get("rounds") else "")
            lines.append(f"| {r['size']} | {r['length']} | {r['variant']} | {_fmt(r['train_tokens_per_second'], 0)} | "
                         f"{_fmt(r['train_speed_ratio'])}{spread} | {_fmt(r['peak_memory_mib'], 0)} | "
                         f"{_fmt(r['peak_memory_ratio'])} |")
    for c in checks:
        if c.get("table") is None:
            lines.append(f"- {c['name']}: {c['status']}" + (f" ({c['reason']})" if c.get("reason") else "")
                         + (f": rule {c['rule']}" if c.get("rule") else ""))
    return lines


def quick_markdown(record) -> str:
    """``summary.md``'s part for ``quick.json``: every answer of ``--quick`` in a few tables."""
    dry = record.get("dry_run")
    rejudged = record.get("rejudged")
    title = "# GPU quick check" + (" (dry run: CPU, toy sizes; not a measurement)" if dry else "")
    lines = [title + (" (re-judged)" if rejudged else ""), "",
             f"`{record.get('command')}` on {record.get('device')}: **{record.get('status')}** in "
             f"{record.get('seconds')}s (budget {record.get('budget_seconds')}s). Details: `quick.json` "
             "next to this file; docs/gpu.md says how to read it.", ""]
    if rejudged:
        lines += [f"Re-judged by `{rejudged['command']}` ({rejudged['when']}): the run said "
                  f"**{rejudged['original_status']}**; judged by today's yardsticks it is **{record.get('status')}**. "
                  "Sources: " + "; ".join(f"{k}: `{v}`" for k, v in rejudged["sources"].items()) + ".", ""]
    lines += ["A status counts the judged checks only: `reported` is measured, not judged; `skipped` did "
              "not run here.", "",
              "| section | status | seconds (reserved) | what ran | checks | failed checks |",
              "| --- | --- | --- | --- | --- | --- |"]
    sections = record.get("sections", {})
    for name in QUICK_SECTIONS:
        sec = sections.get(name)
        if sec is None:
            lines.append(f"| {name} | not run | - | | | |")
            continue
        failed = "; ".join(f"{c['name']}: {c['reason']}" for c in sec["checks"] if c["status"] == "failed")
        reserved = f" ({sec['reserved_seconds']:.0f})" if sec.get("reserved_seconds") else ""
        lines.append(f"| {name} | {sec['status']} | {sec['seconds']:.0f}{reserved} | {_cell(sec.get('ran', '-'))} | "
                     f"{status_counts(sec['checks'])} | {_cell(failed[:500])} |")
    exact = sections.get("exactness")
    if exact:
        lines += ["", "## exactness"] + exactness_lines(exact["checks"])
    train = sections.get("train")
    if train:
        lines += ["", "## mixed precision (fairseq-train on the demo corpus, then fairseq-generate)"]
        lines += train_lines(train["checks"])
    speed = sections.get("speed")
    if speed:
        lines += ["", "## speed and memory (fp16, ratios to vanilla in the same process; a target is judged on "
                  "the median of at least 7 rounds)", ""] + speed_lines(speed["checks"])
    ddp = sections.get("ddp")
    if ddp:
        lines += ["", "## two ranks", "", f"Ran: {ddp.get('ran', '-')}.", ""]
        for c in ddp["checks"]:
            losses = ", ".join(f"{x:.2f}" for _, x in c.get("train_losses", []))
            lines.append(f"- {c['name']}: {c['status']}" + (f" ({c['reason']})" if c.get("reason") else "")
                         + (f"; train losses {losses}" if losses else ""))
    return "\n".join(lines) + "\n"


def summary_markdown(records, ctx) -> str:
    dry = ctx.dry_run
    lines = ["# GPU check" + (" (dry run: CPU, toy sizes; not a measurement)" if dry else ""), ""]
    lines.append("Made by `python -m realformer_tools.experiments.gpu_check` (`make gpu-check`); "
                 "see docs/gpu.md. Each step's JSON is next to this file.")
    lines += ["", "| step | status | seconds | device | note |", "| --- | --- | --- | --- | --- |"]
    for step in STEPS:
        r = records.get(step)
        if r is None:
            lines.append(f"| {step} | not run | - | - | |")
            continue
        notes = [r["ran"]] if r.get("ran") else []
        notes += [status_counts(r["checks"])] if len(r["checks"]) > 1 else []
        notes += [f"{c['name']}: {c['reason']}" for c in r["checks"] if c["status"] == "failed"]
        skipped = sorted({c["reason"] for c in r["checks"] if c["status"] == "skipped"})
        notes += [f"skipped: {'; '.join(skipped)}"] if skipped else []
        notes += [c["reason"] for c in r["checks"] if c["status"] == "passed" and c.get("reason")]
        notes += [f"reported, not judged: {c['name']}: {c['reason']}" for c in r["checks"] if c["status"] == "reported"]
        note = "; ".join(notes)
        if len(note) > 600:
            note = note[:600] + " ..."
        lines.append(f"| {step} | {r['status']} | {r['seconds']:.0f} | {r['device']} | {note.replace('|', '/')} |")

    tests = records.get("tests")
    if tests:
        c = tests["checks"][0]
        lines += ["", "## tests", "", f"`{c.get('command')}`: {c.get('counts')}"]
        if c.get("failed_tests"):
            lines += ["", "Failed: " + ", ".join(f"`{t}`" for t in c["failed_tests"])]

    train = records.get("train")
    if train:
        lines += ["", "## train (fairseq-train on the demo corpus, then fairseq-generate)"]
        lines += train_lines(train["checks"])

    ddp = records.get("ddp")
    if ddp:
        lines += ["", "## ddp (two ranks, gloo)", "", f"Ran: {ddp.get('ran', '-')}.", "",
                  "| run | status | seconds | train losses |",
                  "| --- | --- | --- | --- |"]
        for c in ddp["checks"]:
            losses = ", ".join(f"{x:.2f}" for _, x in c.get("train_losses", []))
            status = c["status"] + (f": {c['reason']}" if c.get("reason") else "")
            lines.append(f"| {c['name']} | {status.replace('|', '/')} | {c.get('seconds', '-')} | {losses} |")

    from .. import benchmark

    speed_results = {}
    for dtype in ctx.sizes.speed_dtypes:
        result = fairseq_runs.read_json(ctx.speed_path(dtype))
        if result:
            speed_results[dtype] = result
            lines += ["", f"## speed, {dtype} (`{result.get('command', '')}`)", "",
                      f"{result.get('gpu') or result.get('device')}, torch {result.get('torch')}. "
                      "Ratios are to vanilla `transformer` in the same run.", "",
                      benchmark.markdown_table(result).rstrip()]
    rule = fairseq_runs.read_json(ctx.rule_path())
    if rule:
        lines += ["", "## kernel rule for `auto` on CUDA (`kernel_rule.json`)", "",
                  f"On {rule['device']} ({rule['dtype']}): first layer of a path **{rule['rule']['first_layer']}**, "
                  f"later layers **{rule['rule']['later_layers']}** (fastest per position with peak memory not "
                  f"above materialized). Command: `{rule['command']}`", "",
                  "| variant (first+later) | time x materialized (geomean) | memory not above materialized |",
                  "| --- | --- | --- |"]
        m = rule["measured"]
        for name, score in sorted(m["geomean_ratio_to_materialized"].items(), key=lambda kv: kv[1]):
            lines.append(f"| {name} | {score:.2f} | {m['memory_not_worse_than_materialized'][name]} |")

    lines += ["", "## targets (issue 15)", ""]
    measured = "" if not dry else " (dry run: CPU toy sizes, not the target's conditions)"
    rows = speed_targets(speed_results.get("float16"))
    if rows:
        lines += ["| target | size | T | variant | train x vanilla: median (range, rounds) | peak memory x vanilla | |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for r in rows:
            verdict = _verdict(r["met"]) if r["met"] is not None else (
                f"not judged: {r['rounds']} rounds" if r["speed_ratio"] is not None else "not measured")
            lines.append(f"| train >= {r['min_speed']:.2f}x, memory <= {r['max_memory']:.2f}x (fp16) | {r['size']} | "
                         f"{r['length']} | {r['variant']} | {_fmt(r['speed_ratio'])} ({_fmt(r['speed_low'])}-"
                         f"{_fmt(r['speed_high'])}, {r['rounds']}) | {_fmt(r['memory_ratio'])} | {verdict}{measured} |")
    else:
        lines.append("- speed at T = 128 and 512 in fp16: not measured" + (" (dry run lengths)" if dry else ""))
    rows = loss_targets(train)
    if rows:
        lines += ["", "| fp16 against fp32, one seed (reported; the judged precision checks are above) | kernel | "
                  "fp16 valid loss | fp32 valid loss | difference |", "| --- | --- | --- | --- | --- |"]
        for r in rows:
            diff = "-" if r["relative"] is None else f"{100 * r['relative']:.2f}%"
            lines.append(f"| after {ctx.sizes.train_updates} updates | {r['kernel']} | "
                         f"{_fmt(r['fp16'], 3)} | {_fmt(r['fp32'], 3)} | {diff} |")
    return "\n".join(lines) + "\n"
