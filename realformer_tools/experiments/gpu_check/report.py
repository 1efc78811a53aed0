"""``summary.md`` of a device run: one line per section, then each section's tables."""

from .records import status_counts
from .settings import GPU_BOUND_NOTE, SECTIONS


def _f(x, digits=2):
    return "-" if x is None else f"{x:.{digits}f}"


def _e(x):
    return "-" if x is None else f"{x:.1e}"


def _cell(text):
    return str(text).replace("|", "/").replace("\n", " ")


def exactness_lines(checks):
    lines = ["| check | status | output | worst gradient (tensor) | limits | unforced: flips, worst gradient |",
             "| --- | --- | --- | --- | --- | --- |"]
    for c in checks:
        if "output_relative" not in c:
            continue
        limits = f"{_e(c.get('limit_output'))} / {_e(c.get('limit_gradient'))}" if "limit_output" in c else "-"
        flips = c.get("relu_flips")
        unforced = "-" if not flips else f"{flips['count']}, {_e(c['unforced']['gradient'])}"
        lines.append(f"| {c['name']} | {c['status']} | {_e(c['output_relative'])} | {_e(c['max_relative'])} "
                     f"(`{c.get('worst_tensor')}`) | {limits} | {unforced} |")
    for c in checks:
        if "distances" in c:
            lines.append(f"- {c['name']} (output / worst gradient): " + ", ".join(
                f"{k} {_e(v['output'])} / {_e(v['gradient'])}" for k, v in c["distances"].items()))
    return lines


def speed_lines(checks):
    table = next((c["table"] for c in checks if "table" in c), [])
    lines = ["| size | tokens/batch | T | dtype | variant | x vanilla: median (range), rounds | GPU busy | memory |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in table:
        busy = "-" if r["busy"] is None else f"{100 * r['busy']:.0f}%" + (" (host-bound)" if r["host_bound"] else "")
        lines.append(f"| {r['size']} | {r['tokens']} | {r['length']} | {r['dtype']} | {r['variant']} | "
                     f"{_f(r['ratio'])} ({_f(r['low'])}-{_f(r['high'])}), {r['rounds']} | {busy} | {_f(r['memory'])} |")
    return lines + ["", GPU_BOUND_NOTE]


def train_lines(checks):
    lines = ["| run | status | updates | first / last train loss | decode |", "| --- | --- | --- | --- | --- |"]
    for c in checks:
        if "train_losses" in c and "precision" in c and "backend" not in c:
            losses = c["train_losses"]
            first_last = f"{losses[0][1]:.3f} / {losses[-1][1]:.3f}" if losses else "-"
            decode = (c.get("generate") or {}).get("bleu_line") or (c.get("generate") or {}).get("reason") or "-"
            lines.append(f"| {c['name']} | {c['status']}{': ' + _cell(c['reason']) if c.get('reason') else ''} | "
                         f"{c.get('updates', '-')} | {first_last} | {_cell(decode)} |")
    return lines


def summary_markdown(records, dry_run, args="") -> str:
    title = "# GPU device run" + (" (dry run: CPU, tiny shapes; not a measurement)" if dry_run else "")
    lines = [title, "", f"`python -m realformer_tools.experiments.gpu_check {args}`".replace(" `", "`"), "",
             "A status counts the judged checks only: `reported` is measured, not judged; `skipped` did not run here.",
             "", "| section | status | seconds (deadline) | budget clock | device | checks | failed |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for name in SECTIONS:
        r = records.get(name)
        if r is None:
            lines.append(f"| {name} | not run | - | - | - | | |")
            continue
        failed = "; ".join(f"{c['name']}: {c.get('reason')}" for c in r["checks"] if c["status"] == "failed")
        clock = r.get("budget_clock")
        at = f"{clock['start']}-{clock['end']} s of {clock['budget']:.0f} ({clock['what']})" if clock else "-"
        lines.append(f"| {name} | {r['status']} | {r['seconds']:.0f} ({r['deadline_seconds']:.0f}) | {at} | "
                     f"{r['device']} | {status_counts(r['checks'])} | {_cell(failed[:400])} |")
    makers = dict(speed=speed_lines, exactness=exactness_lines, train=train_lines)
    for name, r in records.items():
        lines += ["", f"## {name}", ""] + makers.get(name, lambda checks: [])(r["checks"])
        lines += [f"- {c['name']}: {c['status']}" + (f" ({_cell(c['reason'])})" if c.get("reason") else "")
                  for c in r["checks"] if "table" not in c and "output_relative" not in c and "distances" not in c
                  and not (name == "train" and "train_losses" in c)]
    return "\n".join(lines) + "\n"
