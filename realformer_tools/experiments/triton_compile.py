"""The ``triton`` kernels compiled for GPUs without one: Triton's own compiler to PTX, its
``ptxas`` to a cubin, for each architecture (sm_80, sm_86, sm_90), head dim (64, 128) and
dtype (fp16, bf16), with the block sizes, warps and stages the kernel launches with there
(``triton.block_config``) and the specialization a training run's launch gets (pointers and
strides divisible by 16; lengths, flags, seed and offset runtime values). Per kernel:
registers, spill bytes (stores + loads, ``ptxas -v``), shared memory, and the cubin's SASS
instruction count with a few kinds counted apart (async copies ``LDGSTS``, global loads
``LDG``, tensor-core ``HMMA`` / ``HGMMA``, local memory ``LDL``/``STL``).

    python -m realformer_tools.experiments.compile_check --triton --json results/triton_compile.json
    python -m realformer_tools.experiments.triton_compile --archs 90 --dims 64 --dtypes fp16 \\
        --kernels /tmp/triton_before.py        # another version of triton.py, for before/after counts

Runs in its own process with ``TRITON_INTERPRET=0`` (it sets it when triton is not imported yet).
"""

import argparse
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile

ARCHS = (80, 86, 90)
DIMS = (64, 128)
DTYPES = ("fp16", "bf16")
KERNELS = ("_forward", "_delta", "_backward_kv", "_backward_q")
# shared memory per block a kernel may use (the opt-in maximum), bytes
SHARED_LIMIT = {80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 227 * 1024}
SUMS = ("PREV", "A", "M", "L", "ROOT", "GNEXT", "DELTA", "G")  # float32 buffers
HALVES = ("Q", "K", "V", "OUT", "DO", "DK", "DV", "DQ", "Q1", "K1")  # the inputs' dtype
FLOATS = {"scale": "fp32", "divisor": "fp32", "dropout_p": "fp32", "seed": "i64", "offset": "i64"}
COUNTED = ("LDGSTS", "LDG", "STG", "HMMA", "HGMMA", "LDL", "STL")


def kernels_module(path=None):
    """The Triton kernels (``realformer_nmt/.../triton.py``, or the file at ``path``), compiled, not interpreted."""
    if "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "0"
    if path is None:
        import realformer_nmt.modules.residual_attention.triton as module
    else:
        spec = importlib.util.spec_from_file_location("triton_kernels_under_test", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    if module.INTERPRETED:
        raise RuntimeError("triton was imported with TRITON_INTERPRET=1: run this in a process of its own")
    return module


def config(module, arch, dim, dtype, kernel="_forward"):
    """``(constexprs, options)`` ``kernel`` launches with on ``sm_<arch>`` (an older triton.py without
    ``block_config``: the rule it had, 64 x 64 blocks, 4 warps up to d = 64, 8 above)."""
    import triton.language as tl

    tl_dtype = dict(fp16=tl.float16, bf16=tl.bfloat16, fp32=tl.float32)[dtype]
    if hasattr(module, "block_config"):
        import torch

        return module.block_config(dict(fp16=torch.float16, bf16=torch.bfloat16, fp32=torch.float32)[dtype], dim,
                                   (arch // 10, arch % 10), backward_kv=kernel in ("_backward_kv", "_delta"))
    block_d = max(16, 1 << (dim - 1).bit_length())
    block = 32 if block_d > 64 and dtype == "fp32" else 64
    return (dict(DOT=tl_dtype, PRECISION="ieee" if dtype == "fp32" else "tf32", BLOCK_D=block_d, BLOCK_M=block,
                 BLOCK_N=block), dict(num_warps=4 if block_d <= 64 else 8, num_stages=2))


def signature(fn, dtype, runtime, consts):
    """``(signature, attrs)`` as a training run's launch specializes it."""
    sig, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in consts:
            sig[name] = "constexpr"
        elif name in SUMS:
            sig[name] = "*fp32"
        elif name in HALVES:
            sig[name] = "*" + dtype
        elif name == "PAD":
            sig[name] = "*u8"
        else:
            sig[name] = FLOATS.get(name, "i32")
        pointer = sig[name].startswith("*")
        stride = re.fullmatch(r"s[a-z]+_[bhts]", name) is not None or name == "D"
        if pointer or (stride and name not in runtime):
            attrs[(i,)] = [["tt.divisibility", 16]]
    return sig, attrs


def ptxas_usage(ptx, arch):
    """``(registers, spill bytes)`` from ``ptxas -v`` on the kernel's PTX, as Triton ran it."""
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        proc = subprocess.run([get_ptxas(arch).path, "-v", "-lineinfo",
                               f"--gpu-name={sm_arch_from_capability(arch)}", src, "-o", src + ".o"],
                              capture_output=True, text=True, check=True)
    text = proc.stderr + proc.stdout
    registers = int(re.search(r"Used (\d+) registers", text).group(1))
    spills = sum(int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", text))
    return registers, spills


def sass_counts(cubin):
    """The cubin's SASS (``cuobjdump -sass``): instructions in all (no ``NOP``), in the largest loop's
    body (a backward branch's span: what one iteration over a block of keys or queries executes),
    and the kinds of ``COUNTED``."""
    from triton.tools.disasm import path_to_cuobjdump

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "k.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        sass = subprocess.run([path_to_cuobjdump(), "-sass", path], capture_output=True, text=True, check=True).stdout
    opcodes, loop = [], 0
    for address, text in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass):  # "/*0a10*/  @!P0 BRA 0x980 ;"
        words = text.split()
        words = words[1:] if words and words[0].startswith("@") else words  # a predicate
        opcodes.append(words[0].split(".")[0] if words else "")
        if opcodes[-1] == "BRA" and words[-1].startswith("0x") and int(words[-1], 16) < int(address, 16):
            loop = max(loop, (int(address, 16) - int(words[-1], 16)) // 16 + 1)  # a backward branch: a loop
    counts = {"instructions": sum(1 for op in opcodes if op not in ("NOP", "")), "loop_instructions": loop}
    counts.update({kind: sum(1 for op in opcodes if op == kind) for kind in COUNTED})
    return counts


def compile_one(module, name, arch, dim, dtype):
    """One kernel for one target: its record."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn = getattr(module, name)
    consts, options = config(module, arch, dim, dtype, name)
    consts = {k: v for k, v in consts.items() if k in fn.arg_names}
    sig, attrs = signature(fn, dtype, getattr(module, "RUNTIME", ()), consts)
    source = ASTSource(fn, sig, constexprs={(fn.arg_names.index(k),): v for k, v in consts.items()}, attrs=attrs)
    kernel = triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)
    registers, spills = ptxas_usage(kernel.asm["ptx"], arch)
    shared = kernel.metadata.shared
    return dict(kernel=name, arch=f"sm_{arch}", head_dim=dim, dtype=dtype, registers=registers, spill_bytes=spills,
                shared_bytes=shared, shared_limit=SHARED_LIMIT[arch],
                block=[consts.get("BLOCK_M"), consts.get("BLOCK_N")],
                num_warps=options.get("num_warps"), num_stages=options.get("num_stages"),
                **sass_counts(kernel.asm["cubin"]))


def run(archs=ARCHS, dims=DIMS, dtypes=DTYPES, kernels=KERNELS, path=None, log=print):
    module = kernels_module(path)
    rows = []
    for arch in archs:
        for dim in dims:
            for dtype in dtypes:
                for name in kernels:
                    rows.append(compile_one(module, name, arch, dim, dtype))
                    log(row_line(rows[-1]))
    import triton

    return dict(triton=triton.__version__, kernels_file=path or "realformer_nmt/modules/residual_attention/triton.py",
                rows=rows)


def row_line(r):
    return (f"{r['arch']} d={r['head_dim']} {r['dtype']} {r['kernel']}: {r['registers']} registers, "
            f"{r['spill_bytes']} B spilled, {r['shared_bytes'] / 1024:.1f} KB shared, {r['instructions']} SASS, "
            f"loop {r['loop_instructions']} "
            f"({r['LDGSTS']} LDGSTS, {r['LDG']} LDG, {r['HMMA'] + r['HGMMA']} MMA)")


CELLS = (  # the table's columns after the block: what each shows of a row
    lambda r: str(r["registers"]),
    lambda r: f"{r['spill_bytes']} B",
    lambda r: f"{r['shared_bytes'] / 1024:.1f}",
    lambda r: f"{r['instructions']} ({r['loop_instructions']})",
    lambda r: f"{r['LDGSTS']} / {r['LDG']} / {r['HMMA'] + r['HGMMA']}",
)


def markdown(result):
    """The table docs/performance.md quotes: one line per architecture, head dim and kernel, its
    dtypes side by side (``a / b`` where they differ)."""
    groups = {}
    for r in result["rows"]:
        groups.setdefault((r["arch"], r["head_dim"], r["kernel"]), []).append(r)
    dtypes = " / ".join(dict.fromkeys(r["dtype"] for r in result["rows"]))
    lines = [f"{dtypes} (a cell shows both where they differ):", "",
             "| arch | d | kernel | blocks, warps | registers | spilled | shared KB (limit) | SASS (main loop) | "
             "LDGSTS / LDG / MMA |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for (arch, dim, kernel), rows in groups.items():
        r = rows[0]
        cells = [" / ".join(dict.fromkeys(show(x) for x in rows)) for show in CELLS]
        cells[2] += f" ({r['shared_limit'] // 1024})"
        block = "x".join(str(b) for b in r["block"] if b is not None)
        lines.append(f"| {arch} | {dim} | `{kernel}` | {block}, {r['num_warps']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _ints(text):
    return [int(x) for x in text.split(",") if x.strip()]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--archs", type=_ints, default=list(ARCHS), help="compute capabilities (default 80,86,90)")
    p.add_argument("--dims", type=_ints, default=list(DIMS), help="head dims (default 64,128)")
    p.add_argument("--dtypes", default=",".join(DTYPES), help="fp16, bf16, fp32 (default fp16,bf16)")
    p.add_argument("--only", default=",".join(KERNELS), help="kernels (default: all four)")
    p.add_argument("--kernels", default=None, help="another triton.py to compile (default: the package's)")
    p.add_argument("--json", default=None, help="write the rows here")
    p.add_argument("--markdown", action="store_true", help="print the table docs/performance.md quotes")
    args = p.parse_args(argv)
    result = run(args.archs, args.dims, [d for d in args.dtypes.split(",") if d], args.only.split(","), args.kernels,
                 log=lambda m: print(m, file=sys.stderr, flush=True))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
            f.write("\n")
    if args.markdown:
        print(markdown(result))
    return result


if __name__ == "__main__":
    main()
