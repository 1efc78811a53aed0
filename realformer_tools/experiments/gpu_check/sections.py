"""The ``tests`` and ``speed`` sections: the triton kernel's tests (and the half-precision
tests) on CUDA, judged from their JUnit XML; the speed rows of ``scripts/benchmark_speed.py``
against the targets (a variant that failed in a row: a failed check, the row measured without
it), and the CUDA rule for ``auto`` from the GPU-bound rows."""

import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree

from .records import check, portable, rel
from .rule import rule_from_speed
from .settings import FIRST_PASS_SLACK, GPU_TESTS, REPO, SPEED_TARGETS, TRITON_TESTS


def junit_counts(xml_path):
    """``({"passed", "failed", "skipped"}, failed test ids)`` of a pytest JUnit XML file."""
    counts, failed = {"passed": 0, "failed": 0, "skipped": 0}, []
    try:
        root = ElementTree.parse(xml_path).getroot()
    except (OSError, ElementTree.ParseError):
        return counts, failed
    for case in root.iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            counts["failed"] += 1
            failed.append(f"{case.get('classname', '')}::{case.get('name', '')}")
        else:
            counts["skipped" if case.find("skipped") is not None else "passed"] += 1
    return counts, failed


def tests_section(run, deadline):
    """``TRITON_TESTS`` then ``GPU_TESTS``, each with what is left of the deadline. The dry run
    only collects the first (the CPU suite runs them under Triton's interpreter)."""
    checks = []
    runs = [("triton kernel tests", TRITON_TESTS)] + ([] if run.dry_run else [("half-precision tests", GPU_TESTS)])
    for name, select in runs:
        xml = os.path.abspath(os.path.join(run.work, f"{name.split()[0]}-tests.xml"))  # pytest runs in REPO
        log_path = xml.replace(".xml", ".log")
        cmd = [sys.executable, "-m", "pytest", *select, "-q", "-p", "no:cacheprovider", "-rfE", "--maxfail", "5",
               f"--junitxml={xml}"] + (["--collect-only"] if run.dry_run else [])
        shown = portable(cmd).replace(xml, rel(xml))
        left = deadline - time.time()
        if left < 5:
            checks.append(check(name, "failed", "not run: the section's deadline had passed", command=shown))
            continue
        if os.path.exists(xml):
            os.remove(xml)
        with open(log_path, "w", encoding="utf-8") as out:
            try:
                code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=run.env(), cwd=REPO,
                                      timeout=left).returncode
            except subprocess.TimeoutExpired:
                code = None
        counts, failed = junit_counts(xml)
        details = dict(command=shown, log=rel(log_path), counts=counts, failed_tests=failed)
        run.log(f"tests: {name}: exit {code}, {counts}")
        if run.dry_run:
            collected = sum(1 for line in open(log_path, errors="replace") if "::" in line)
            checks.append(check(name, "skipped" if code == 0 else "failed", f"dry run: {collected} tests collected, "
                                "none run (CUDA)" if code == 0 else f"collection failed (exit {code})", **details))
        elif code is None:
            checks.append(check(name, "failed", f"stopped at the deadline after {counts['passed']} passed", **details))
        elif counts["failed"] or code not in (0, 5):
            checks.append(check(name, "failed", f"exit {code}: {len(failed)} failed", **details))
        else:
            checks.append(check(name, "passed" if counts["passed"] else "skipped", None, **details))
    return checks


def speed_section(run, deadline):
    """One ``scripts/benchmark_speed.py`` call per entry of ``sizes.speed_calls``, each told
    the time left (it starts no row after it and writes its JSON after every row); then the
    targets and the rule."""
    results, checks = [], []
    for i, args in enumerate(run.sizes.speed_calls):
        path = os.path.join(run.work, f"speed_{i + 1}.json")
        left = deadline - time.time()
        cmd = [sys.executable, rel(os.path.join(REPO, "scripts", "benchmark_speed.py")), "--device", run.device,
               *args, "--deadline", str(max(0, int(left - 30))), "--json", path]
        if left < 10:
            checks.append(check(f"benchmark_speed {' '.join(args)}", "failed", "not run: the deadline had passed"))
            continue
        run.log(f"speed: {portable(cmd)}")
        with open(path.replace(".json", ".log"), "w", encoding="utf-8") as out:
            try:
                code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=run.env(threads=1 if run.dry_run
                                                                                              else None),
                                      timeout=left).returncode
            except subprocess.TimeoutExpired:
                code = "stopped at the deadline"
        if os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                results.append(json.load(f))
            run.copy_out(path, f"speed_{i + 1}.json")
        if code != 0:
            checks.append(check(f"benchmark_speed call {i + 1}", "failed", f"exit {code} (rows kept: "
                                f"{len(results[-1]['configs']) if os.path.exists(path) else 0})",
                                command=portable(cmd), log=rel(path.replace(".json", ".log"))))
    configs = [c for r in results for c in r["configs"]]
    checks.insert(0, check("speed rows", "reported", f"{len(configs)} rows measured", table=speed_table(configs),
                           not_run=[k for r in results for k in r.get("not_run", [])]))
    checks += [check(f"{v} at {row_name(c)}", "failed", f"left out of the row (the others went on): {error}",
                     variant=v) for c in configs for v, error in (c.get("failed") or {}).items()]
    checks += target_checks(configs, [p for r in results for p in r.get("first_pass", [])], run.dry_run)
    if results:
        merged = dict(results[0], configs=configs, command=" ; ".join(r["command"] for r in results))
        try:
            rule = rule_from_speed(merged, "speed_*.json (this run)")
        except ValueError as exc:
            checks.append(check("kernel rule for auto on CUDA", "reported", f"not derived: {exc}"))
        else:
            with open(os.path.join(run.work, "kernel_rule.json"), "w", encoding="utf-8") as f:
                json.dump(rule, f, indent=1)
            checks.append(check("kernel rule for auto on CUDA", "reported", rule["measured"]["why"],
                                rule=rule["rule"], kernel_rule=rule))
    return checks


def row_name(c):
    return (f"{c['size']}, {c['tokens_per_batch']} tokens, T = {c['length']}, {c['dtype']}"
            + (", padded" if c.get("padded") else ""))


def speed_table(configs):
    """One line per row and variant, as summary.md shows them."""
    return [dict(size=c["size"] + (" (padded)" if c.get("padded") else ""), tokens=c["tokens_per_batch"],
                 length=c["length"], dtype=c["dtype"], variant=v,
                 attention_dropout=c.get("attention_dropout"), ratio=r.get("train_speed_ratio"),
                 low=r.get("train_speed_low"), high=r.get("train_speed_high"), rounds=c["rounds"],
                 busy=r.get("gpu_busy_fraction"), memory=r.get("peak_memory_ratio"), host_bound=c.get("host_bound"))
            for c in configs for v, r in c["variants"].items()]


def target_checks(configs, first_passes, dry_run):
    """The targets of docs/performance.md, each judged on the rows that measure it (a row that
    is host-bound is judged only by a target written for host work)."""
    checks = []
    for where, variant, speed, memory in SPEED_TARGETS:
        rows = [c for c in configs if all(c.get(k) == v for k, v in where.items()) and variant in c["variants"]]
        for c in rows:
            r = c["variants"][variant]
            name = (f"{variant} at {row_name(c)}: >= {speed:.2f}x vanilla"
                    + (f", memory <= {memory:.2f}x" if memory else ""))
            got = f"{r['train_speed_ratio']:.2f}x ({r['train_speed_low']:.2f}-{r['train_speed_high']:.2f})" + (
                f", memory {r['peak_memory_ratio']:.2f}x" if memory and r.get("peak_memory_ratio") else "")
            met = r["train_speed_ratio"] >= speed and (not memory or (r.get("peak_memory_ratio") or 9) <= memory)
            status = "reported" if dry_run else ("passed" if met else "failed")
            checks.append(check(name, status, ("dry run, toy sizes: " if dry_run else "") + got, row=list(
                (c["size"], c["tokens_per_batch"], c["length"], c["dtype"])), variant=variant))
    for p in first_passes:
        ratios = p.get("ratio_to_vanilla") or {}
        for variant, ratio in ratios.items():
            if variant == "vanilla":
                continue
            met = ratio <= FIRST_PASS_SLACK
            status = "reported" if dry_run or variant != "triton" else ("passed" if met else "failed")
            checks.append(check(f"{variant}: first pass over {len(p['lengths'])} new lengths <= "
                                f"{FIRST_PASS_SLACK:.2f}x vanilla's", status, f"{ratio:.2f}x "
                                f"({p['seconds'][variant]:.1f}s against {p['seconds']['vanilla']:.1f}s)",
                                variant=variant))
    return checks
