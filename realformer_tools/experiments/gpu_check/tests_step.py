"""The ``tests`` step: ``pytest -m gpu`` (the dry run: ``tests/test_gpu.py`` whole, its
CUDA cases skipped), judged from its JUnit XML."""

import os
import subprocess
import sys
import xml.etree.ElementTree as ElementTree

from .. import fairseq_runs
from .records import check, portable, rel
from .settings import REPO, TESTS_SECONDS


class TestsStep:
    """``GpuCheck``'s ``tests`` step (uses its ``work``, ``dry_run``, ``env`` and ``log``)."""

    def step_tests(self):
        """``pytest -m gpu``; the dry run runs ``tests/test_gpu.py`` whole (its CPU cases
        run, its CUDA ones are skipped)."""
        xml = os.path.join(self.work, "pytest.xml")
        log_path = os.path.join(self.work, "pytest.log")
        tests = rel(os.path.join(REPO, "tests"))
        select = [os.path.join(tests, "test_gpu.py")] if self.dry_run else ["-m", "gpu", tests]
        cmd = [sys.executable, "-m", "pytest", *select, "-q", "-p", "no:cacheprovider", f"--junitxml={xml}",
               "-o", "junit_family=xunit2"]
        self.log(f"tests: {portable(cmd)}")
        if os.path.exists(xml):
            os.remove(xml)
        with open(log_path, "w", encoding="utf-8") as out:
            try:
                proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=self.env(threads=os.cpu_count()),
                                      timeout=TESTS_SECONDS, cwd=os.getcwd())
                code = proc.returncode
            except subprocess.TimeoutExpired:
                code = None
        counts, failed, skip_reasons = _junit_counts(xml)
        tail = fairseq_runs.read_log(log_path)[-1:]
        details = dict(command=portable(cmd), log=rel(log_path), counts=counts, failed_tests=failed,
                       skip_reasons=skip_reasons, pytest_summary=tail[0] if tail else None)
        if code is None:
            return [check("pytest", "failed", f"pytest ran past {TESTS_SECONDS // 60} minutes (the whole of "
                          "pytest -m gpu must fit in that on one H100; the log has the stacks of a test past its own "
                          "limit)", **details)]
        if code not in (0, 5) or counts["failed"] or counts["errors"]:
            return [check("pytest", "failed", f"pytest exit code {code}: {len(failed)} failed", **details)]
        if counts["passed"] == 0:
            return [check("pytest", "skipped", "no test ran (no CUDA device)", **details)]
        reason = None
        if self.dry_run:
            reason = f"dry run: the CPU cases ran; {counts['skipped']} CUDA cases skipped (no CUDA)"
        return [check("pytest", "passed", reason, **details)]


def _junit_counts(xml_path):
    counts = {"tests": 0, "passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    failed, reasons = [], {}
    try:
        root = ElementTree.parse(xml_path).getroot()
    except (OSError, ElementTree.ParseError):
        return counts, failed, reasons
    for case in root.iter("testcase"):
        counts["tests"] += 1
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        if case.find("failure") is not None:
            counts["failed"] += 1
            failed.append(name)
        elif case.find("error") is not None:
            counts["errors"] += 1
            failed.append(name)
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
            reason = case.find("skipped").get("message", "")
            reasons[reason] = reasons.get(reason, 0) + 1
        else:
            counts["passed"] += 1
    return counts, failed, reasons
