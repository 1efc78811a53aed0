"""The ``triton`` kernels compile for a GPU without one: Triton's own compiler (to PTX and, with
the ptxas its wheel ships, to a cubin) for an H100/H200 (sm_90) in fp16, the kernels as a
training run launches them (runtime flags and lengths), within an H100's shared memory. The
interpreter, which the other tests use, cannot show this: it runs Python, not the compiler."""

import os
import subprocess
import sys

import pytest
from conftest import REPO

CODE = r"""
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import realformer_nmt.modules.residual_attention.triton as tk

assert not tk.INTERPRETED
FLOATS = dict(scale="fp32", divisor="fp32", dropout_p="fp32", seed="i64", offset="i64")


def compile_(fn, types, constexprs):
    signature = {name: "constexpr" if name in constexprs else types.get(name, "i32") for name in fn.arg_names}
    source = ASTSource(fn, signature, constexprs={(fn.arg_names.index(n),): v for n, v in constexprs.items()})
    kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4, num_stages=2))
    print(fn.__name__, kernel.metadata.shared)


half, sums = "*fp16", "*fp32"
blocks = dict(DOT=tl.float16, PRECISION="tf32", BLOCK_M=64, BLOCK_N=64, BLOCK_D=64)
compile_(tk._forward, dict(Q=half, K=half, V=half, PREV=sums, PAD="*u8", A=sums, OUT=half, M=sums, L=sums, **FLOATS),
         blocks)
compile_(tk._delta, dict(OUT=half, DO=half, DELTA=sums), dict(BLOCK_M=64, BLOCK_D=64))
compile_(tk._backward_kv, dict(Q=half, K=half, V=half, DO=half, ROOT=sums, Q1=half, K1=half, GNEXT=sums, PAD="*u8",
                               M=sums, L=sums, DELTA=sums, G=sums, DK=half, DV=half, **FLOATS), blocks)
compile_(tk._backward_q, dict(G=sums, K=half, DQ=half, scale="fp32"), blocks)
print("compiled")
"""


def test_the_kernels_compile_for_sm90():
    pytest.importorskip("triton", reason="triton is not installed (pip install '.[triton]')")
    env = dict(os.environ, TRITON_INTERPRET="0", PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True, text=True, timeout=600)
    if "No module named 'triton.backends.nvidia'" in proc.stderr:
        pytest.skip("this triton has no CUDA backend")
    assert proc.returncode == 0 and proc.stdout.strip().endswith("compiled"), proc.stderr[-3000:]
    shared = {line.split()[0]: int(line.split()[1]) for line in proc.stdout.splitlines()[:-1]}
    assert max(shared.values()) <= 228 * 1024, shared  # an H100's shared memory per block
