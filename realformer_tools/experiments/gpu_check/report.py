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


def quick_markdown(record) -> str:
    """``summary.md``'s part for ``quick.json``: every answer of ``--quick`` in a few tables."""
    dry = record.get("dry_run")
    lines = ["# GPU quick check" + (" (dry run: CPU, toy sizes; not a measurement)" if dry else ""), "",
             f"`{record.get('command')}` on {record.get('device')}: **{record.get('status')}** in "
             f"{record.get('seconds')}s (budget {record.get('budget_seconds')}s). Details: `quick.json` "
             "next to this file; docs/gpu.md says how to read it.", "",
             "A status counts the judged checks only: `reported` is measured, not judged; `skipped` did "
             "not run here.", "",
             "| section | status | seconds | what ran | checks | failed checks |",
             "| --- | --- | --- | --- | --- | --- |"]
    sections = record.get("sections", {})
    for name in QUICK_SECTIONS:
        sec = sections.get(name)
        if sec is None:
            lines.append(f"| {name} | not run | - | | | |")
            continue
        failed = "; ".join(f"{c['name']}: {c['reason']}" for c in sec["checks"] if c["status"] == "failed")
        lines.append(f"| {name} | {sec['status']} | {sec['seconds']:.0f} | {_cell(sec.get('ran', '-'))} | "
                     f"{status_counts(sec['checks'])} | {_cell(failed[:500])} |")
    exact = sections.get("exactness")
    if exact:
        lines += ["", "## exactness (float32, per parameter tensor, relative error <= 1e-4)", "",
                  "| check | status | max relative error | worst tensor | tensors (q/k projections) |",
                  "| --- | --- | --- | --- | --- |"]
        for c in exact["checks"]:
            if "max_relative" in c:
                lines.append(f"| {c['name']} | {c['status']} | {_fmt(c['max_relative'], 8)} | "
                             f"`{c['worst_tensor']}` | {c['tensors']} ({c['q_k_projections']}) |")
            elif "relative_errors" in c:
                errs = ", ".join(f"{k} {v:.1e}" for k, v in c["relative_errors"].items())
                lines.append(f"| {c['name']} | {c['status']} | {errs} | | |")
            elif "forward" in c:
                lines.append(f"| {c['name']} | {c['status']} | forward {', '.join(c['forward']['backends'])}; "
                             f"backward {', '.join(c['backward']['backends'])} | | |")
    train = sections.get("train")
    if train:
        lines += ["", "## mixed precision (fairseq-train on the demo corpus, then fairseq-generate)", "",
                  "| precision | kernel | status | updates | first / last train loss | valid loss | decode |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for c in train["checks"]:
            if "fp32_valid_loss" in c or c["name"].startswith(("fp16 valid", "bf16 valid")):
                continue
            status, first_last, decode = _run_cells(c)
            lines.append(f"| {c.get('precision')} | {c.get('kernel')} | {status} | {c.get('updates', '-')} | "
                         f"{first_last} | {_fmt(c.get('valid_loss'), 3)} | {decode} |")
        rows = [c for c in train["checks"] if c["name"].startswith(("fp16 valid", "bf16 valid"))]
        if rows:
            lines += ["", "| target | status | valid loss | fp32 valid loss | difference |",
                      "| --- | --- | --- | --- | --- |"]
            for c in rows:
                diff = "-" if c.get("relative") is None else f"{100 * c['relative']:.2f}%"
                status = c["status"] + (f": {c['reason']}" if c.get("reason") else "")
                lines.append(f"| {c['name']} | {_cell(status)} | {_fmt(c.get('valid_loss'), 3)} | "
                             f"{_fmt(c.get('fp32_valid_loss'), 3)} | {diff} |")
    speed = sections.get("speed")
    if speed:
        lines += ["", "## speed and memory (fp16, ratios to vanilla in the same process)", ""]
        table = next((c.get("table") for c in speed["checks"] if c.get("table")), None)
        if table:
            lines += ["| size | T | variant | train tok/s | x vanilla | peak MiB | x vanilla |",
                      "| --- | --- | --- | --- | --- | --- | --- |"]
            for r in table:
                lines.append(f"| {r['size']} | {r['length']} | {r['variant']} | "
                             f"{_fmt(r['train_tokens_per_second'], 0)} | {_fmt(r['train_speed_ratio'])} | "
                             f"{_fmt(r['peak_memory_mib'], 0)} | {_fmt(r['peak_memory_ratio'])} |")
        for c in speed["checks"]:
            if c.get("table") is None:
                lines.append(f"- {c['name']}: {c['status']}" + (f" ({c['reason']})" if c.get("reason") else ""))
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
        lines += ["", "## train (fairseq-train on the demo corpus, then fairseq-generate)", "",
                  "| precision | kernel | status | updates | first / last train loss | valid loss | x fp32 | decode |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        ref = {c.get("kernel"): c.get("valid_loss") for c in train["checks"] if c.get("precision") == "fp32"}
        for c in train["checks"]:
            if c["status"] == "skipped":
                lines.append(f"| {c['precision']} | {c['kernel']} | skipped: {c['reason']} | | | | | |")
                continue
            base = ref.get(c.get("kernel"))
            ratio = c["valid_loss"] / base if c.get("valid_loss") is not None and base else None
            status, first_last, decode = _run_cells(c)
            lines.append(f"| {c['precision']} | {c['kernel']} | {status} | {c.get('updates', '-')} | "
                         f"{first_last} | {_fmt(c.get('valid_loss'), 3)} | {_fmt(ratio, 4)} | {decode} |")

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
        lines += ["| target | size | T | variant | train x vanilla | peak memory x vanilla | |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for r in rows:
            lines.append(f"| train >= {r['min_speed']:.2f}x, memory <= {r['max_memory']:.2f}x (fp16) | {r['size']} | "
                         f"{r['length']} | {r['variant']} | {_fmt(r['speed_ratio'])} | {_fmt(r['memory_ratio'])} | "
                         f"{_verdict(r['met'])}{measured} |")
    else:
        lines.append("- speed at T = 128 and 512 in fp16: not measured" + (" (dry run lengths)" if dry else ""))
    rows = loss_targets(train)
    if rows:
        lines += ["", "| target | kernel | fp16 valid loss | fp32 valid loss | difference | |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for r in rows:
            diff = "-" if r["relative"] is None else f"{100 * r['relative']:.2f}%"
            lines.append(f"| fp16 loss within 1% of fp32 after {ctx.sizes.train_updates} updates | {r['kernel']} | "
                         f"{_fmt(r['fp16'], 3)} | {_fmt(r['fp32'], 3)} | {diff} | "
                         f"{_verdict(r['met'], r['status'])}{measured} |")
    else:
        lines.append("- fp16 loss within 1% of fp32: not measured" + (" (fp16 needs CUDA)" if dry else ""))
    return "\n".join(lines) + "\n"
