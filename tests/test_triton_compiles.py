"""The ``triton`` kernels compile for GPUs without one: Triton's own compiler (to PTX and, with the
ptxas its wheel ships, to a cubin; ``realformer_tools/experiments/triton_compile.py``) with the
block sizes, warps and stages they launch with there (``triton.block_config``) and the
specialization a training run's launch gets. An H100/H200 (sm_90) in fp16 within its shared
memory; every kernel for sm_80, sm_86 and sm_90 in fp16 and bf16 at head dim 64 without a spill
(registers spilled to local memory); on sm_86 (99 KB of shared memory per block at most) within
it at head dims 64 and 128. The interpreter, which the other tests use, cannot show this: it runs
Python, not the compiler."""

import concurrent.futures
import json
import os
import subprocess
import sys

import pytest
from conftest import REPO

from realformer_tools.experiments.triton_compile import KERNELS, SHARED_LIMIT


def compiled(tmp_path, *targets):
    """The rows of ``triton_compile`` for each ``(archs, dims, dtypes)``, compiled in processes of
    their own (``TRITON_INTERPRET=0``), two at a time."""
    pytest.importorskip("triton", reason="triton is not installed (pip install '.[triton]')")
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=str(REPO))

    def one(i, archs, dims, dtypes):
        out = tmp_path / f"compiled{i}.json"
        proc = subprocess.run([sys.executable, "-m", "realformer_tools.experiments.triton_compile", "--archs", archs,
                               "--dims", dims, "--dtypes", dtypes, "--json", str(out)], env=env, capture_output=True,
                              text=True, timeout=1200)
        if "No module named 'triton.backends.nvidia'" in proc.stderr:
            pytest.skip("this triton has no CUDA backend")
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(out.read_text())["rows"]

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        return [row for rows in pool.map(lambda a: one(a[0], *a[1]), enumerate(targets)) for row in rows]


def test_the_kernels_compile_for_sm90(tmp_path):
    rows = compiled(tmp_path, ("90", "64", "fp16"))
    assert [r["kernel"] for r in rows] == list(KERNELS)
    assert all(0 < r["shared_bytes"] <= SHARED_LIMIT[90] and r["instructions"] > 0 for r in rows), rows


@pytest.mark.slow  # 32 compilations (minutes on a CPU, seconds from Triton's cache)
def test_no_spill_at_head_dim_64_and_sm86_shared_memory_within_99_kb(tmp_path):
    rows = compiled(tmp_path, ("80,86,90", "64", "fp16"), ("80,86,90", "64", "bf16"), ("86", "128", "fp16,bf16"))
    spilled = [(r["arch"], r["dtype"], r["kernel"], r["spill_bytes"]) for r in rows
               if r["head_dim"] == 64 and r["spill_bytes"]]
    assert not spilled, spilled
    assert len({(r["arch"], r["dtype"]) for r in rows if r["head_dim"] == 64}) == 6
    sm86 = [r for r in rows if r["arch"] == "sm_86"]
    assert len(sm86) == 4 * len(KERNELS)  # head dims 64 and 128, fp16 and bf16
    too_big = [(r["head_dim"], r["dtype"], r["kernel"], r["shared_bytes"]) for r in sm86
               if r["shared_bytes"] > 99 * 1024]
    assert not too_big, too_big
