"""The ``triton`` kernel: layer n of a residual path as flash-style Triton kernels that read the
previous layers' running sum ``A_{n-1}`` and write their own ``A_n`` (float32; float64 inputs:
float64), and their autograd function; imported only when this kernel runs (``triton_kernel.py``).

Forward: ``A_n = (q k^T) scale + A_{n-1}`` (raw, unmasked, handed on; on a causal path key blocks
wholly above the diagonal hold zeros, which every reader of such a path masks), ``P =
softmax(mask(A_n / c_n))`` online, ``out = dropout(P) v``. Dropout acts on the probabilities only:
``A_n``, the running sum handed on, carries no dropout, as in the materialized kernel and the
official reference (google-research ``realformer/realformer.py``). Backward rebuilds ``A_n`` tile
by tile with the forward's own :func:`_add_scores` (bit-identical). Under ``TRITON_INTERPRET=1`` the
kernels run on CPU tensors (docs/internals.md#the-triton-kernel).
"""

import contextlib
import functools

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

INTERPRETED = type(tl.zeros).__name__ == "InterpretedFunction"  # as triton_kernel.interpreted() decides
FILL = tl.constexpr(-3.4028234663852886e38)  # torch.finfo(torch.float32).min: a padded key's logit
RUNTIME = ("T", "S", "dropout_p", "seed", "offset", "has_prev", "has_root", "has_pair", "has_gnext", "has_pad",
           "causal", "skip_future")


def _jit(fn):
    """``triton.jit`` (runtime values never specialized), interpreted when triton's own functions are."""
    if INTERPRETED:
        return InterpretedFunction(fn)
    names = [name for name in RUNTIME if name in fn.__code__.co_varnames[:fn.__code__.co_argcount]]
    return JITFunction(fn, do_not_specialize=names)


@_jit
def _add_scores(q, k, scale, base, PRECISION: tl.constexpr):
    """``(q k^T) scale + base`` for one tile: the only way ``A_n`` is formed, in forward and when
    backward rebuilds it, so both give the same bits."""
    return tl.dot(q, tl.trans(k), input_precision=PRECISION).to(base.dtype) * scale + base


@_jit
def _keep(bh, rows, start_n, S, dropout_p, seed, offset, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The dropout keep mask of the tile of ``rows`` x columns from ``start_n`` (a multiple of 4): one
    Philox call per 4 columns, counter ``(row ceil(S / 4) + col // 4, bh, offset)``, its draw ``col % 4``
    kept where, as an unsigned 32-bit integer, it is at least ``p 2^32``."""
    quads = rows[:, None] * ((S + 3) // 4) + (start_n // 4 + tl.arange(0, BLOCK_N // 4))[None, :]
    offset = offset + tl.zeros([], tl.int64)  # (a Python int in the interpreter)
    r0, r1, r2, r3 = tl.philox(seed, quads, bh, offset.to(tl.uint32), (offset >> 32).to(tl.uint32))
    # column 4j + 2e + c takes draw 2e + c of counter j
    draws = tl.reshape(tl.join(tl.join(r0, r2), tl.join(r1, r3)), [BLOCK_M, BLOCK_N])
    return draws >= (tl.full([], 4294967296.0, tl.float32) * dropout_p).to(tl.uint32)


@_jit
def _visible(rows, cols, col_ok, causal):
    return col_ok[None, :] & ((cols[None, :] <= rows[:, None]) | (causal == 0))


@_jit
def _forward(Q, K, V, PREV, PAD, A, OUT, M, L, sq_b, sq_h, sq_t, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s,
             so_b, so_h, so_t, H, T, S, D, scale, divisor, dropout_p, seed, offset, has_prev, has_pad, causal,
             skip_future, DOT: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_D: tl.constexpr):
    bh, pid_m = tl.program_id(0), tl.program_id(1)  # bsz * heads on axis 0: up to 2^31 - 1
    b, h = bh // H, bh % H
    SUM = A.dtype.element_ty
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    row_ok, dim_ok = rows < T, dims < D
    q = tl.load(Q + b * sq_b + h * sq_h + rows[:, None] * sq_t + dims[None, :],
                mask=row_ok[:, None] & dim_ok[None, :], other=0.0).to(DOT)
    head = bh.to(tl.int64) * T * S  # this head's A_n and A_{n-1}: 64-bit base pointers, 32-bit offsets in a tile
    A, PREV = A + head, PREV + head
    tile = rows[:, None] * S
    m_i = tl.full([BLOCK_M], float("-inf"), SUM)
    l_i = tl.zeros([BLOCK_M], SUM)
    acc = tl.zeros([BLOCK_M, BLOCK_D], SUM)
    hi = S
    if skip_future:  # key blocks from here on are above the diagonal for every row of the block
        hi = tl.minimum((pid_m + 1) * BLOCK_M, S)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        col_ok = cols < S
        ok = row_ok[:, None] & col_ok[None, :]
        k = tl.load(K + b * sk_b + h * sk_h + cols[:, None] * sk_s + dims[None, :],
                    mask=col_ok[:, None] & dim_ok[None, :], other=0.0).to(DOT)
        # flag-guarded tiles: masked loads outside any `if` (async copies in the pipeline; no access when off)
        base = tl.load(PREV + tile + cols[None, :], mask=ok & (has_prev != 0), other=0.0)
        a = _add_scores(q, k, scale, base, PRECISION)
        tl.store(A + tile + cols[None, :], a, mask=ok)
        logits = tl.where(_visible(rows, cols, col_ok, causal), a / divisor, float("-inf"))
        padded = tl.load(PAD + b * S + cols, mask=col_ok & (has_pad != 0), other=0) != 0
        logits = tl.where(padded[None, :], FILL, logits)
        m_new = tl.maximum(m_i, tl.max(logits, 1))  # finite: every row sees key 0, real or padded
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(logits - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)  # the softmax's sum: before dropout
        if dropout_p > 0:
            keep = _keep(bh, rows, start_n, S, dropout_p, seed, offset, BLOCK_M, BLOCK_N)
            p = tl.where(keep, p / (1.0 - dropout_p), 0.0)
        v = tl.load(V + b * sv_b + h * sv_h + cols[:, None] * sv_s + dims[None, :],
                    mask=col_ok[:, None] & dim_ok[None, :], other=0.0).to(DOT)
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT), v, input_precision=PRECISION).to(SUM)
        m_i = m_new
    for start_n in range(hi, S, BLOCK_N):  # wholly above the diagonal: zeros, no product
        cols = start_n + tl.arange(0, BLOCK_N)
        tl.store(A + tile + cols[None, :], tl.zeros([BLOCK_M, BLOCK_N], SUM),
                 mask=row_ok[:, None] & (cols < S)[None, :])
    out = acc / l_i[:, None]
    tl.store(OUT + b * so_b + h * so_h + rows[:, None] * so_t + dims[None, :], out.to(OUT.dtype.element_ty),
             mask=row_ok[:, None] & dim_ok[None, :])
    tl.store(M + bh * T + rows, m_i, mask=row_ok)
    tl.store(L + bh * T + rows, l_i, mask=row_ok)


@_jit
def _delta(OUT, DO, DELTA, so_b, so_h, so_t, sdo_b, sdo_h, sdo_t, H, T, D, BLOCK_M: tl.constexpr,
           BLOCK_D: tl.constexpr):
    """``Delta = rowsum(dO * out)`` (= rowsum(P * dP), dropout included), in the sum's dtype."""
    bh, pid_m = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    ok = (rows < T)[:, None] & (dims < D)[None, :]
    SUM = DELTA.dtype.element_ty
    out = tl.load(OUT + b * so_b + h * so_h + rows[:, None] * so_t + dims[None, :], mask=ok, other=0.0).to(SUM)
    do = tl.load(DO + b * sdo_b + h * sdo_h + rows[:, None] * sdo_t + dims[None, :], mask=ok, other=0.0).to(SUM)
    tl.store(DELTA + bh * T + rows, tl.sum(out * do, 1), mask=rows < T)


@_jit
def _backward_kv(Q, K, V, DO, ROOT, Q1, K1, GNEXT, PAD, M, L, DELTA, G, DK, DV, sq_b, sq_h, sq_t, sk_b, sk_h, sk_s,
                 sv_b, sv_h, sv_s, sdo_b, sdo_h, sdo_t, sdk_b, sdk_h, sdk_s, sdv_b, sdv_h, sdv_s,
                 H, T, S, D, scale, divisor, dropout_p, seed, offset, has_root, has_pair, has_gnext, has_pad, causal,
                 skip_future, DOT: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """One block of keys: ``A_n`` rebuilt (``ROOT`` + ``Q1 K1^T`` if ``has_pair`` + ``Q K^T``, scaled),
    ``G_n`` of its column of tiles (written to ``G``), ``dk`` and ``dv``."""
    bh, pid_n = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    SUM = G.dtype.element_ty
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    col_ok, dim_ok = cols < S, dims < D
    kv_ok = col_ok[:, None] & dim_ok[None, :]
    k_at = b * sk_b + h * sk_h + cols[:, None] * sk_s + dims[None, :]
    k = tl.load(K + k_at, mask=kv_ok, other=0.0).to(DOT)
    k1 = tl.load(K1 + k_at, mask=kv_ok & (has_pair != 0), other=0.0).to(DOT)
    v = tl.load(V + b * sv_b + h * sv_h + cols[:, None] * sv_s + dims[None, :], mask=kv_ok, other=0.0).to(DOT)
    real = tl.load(PAD + b * S + cols, mask=col_ok & (has_pad != 0), other=0) == 0
    dk = tl.zeros([BLOCK_N, BLOCK_D], SUM)
    dv = tl.zeros([BLOCK_N, BLOCK_D], SUM)
    head = bh.to(tl.int64) * T * S  # 64-bit base pointers, 32-bit offsets in a tile
    G, ROOT, GNEXT = G + head, ROOT + head, GNEXT + head
    lo = pid_n * 0  # a tensor, so that a runtime `if` may change it (a Python int would not be)
    if skip_future:  # query blocks before lo: the forward's zero blocks, no gradient
        lo = (pid_n * BLOCK_N // BLOCK_M) * BLOCK_M
    for start_m in range(0, lo, BLOCK_M):
        rows = start_m + tl.arange(0, BLOCK_M)
        tl.store(G + rows[:, None] * S + cols[None, :], tl.zeros([BLOCK_M, BLOCK_N], SUM),
                 mask=(rows < T)[:, None] & col_ok[None, :])
    for start_m in range(lo, T, BLOCK_M):
        rows = start_m + tl.arange(0, BLOCK_M)
        row_ok = rows < T
        ok = row_ok[:, None] & col_ok[None, :]
        at = rows[:, None] * S + cols[None, :]
        qd_ok = row_ok[:, None] & dim_ok[None, :]
        q_at = b * sq_b + h * sq_h + rows[:, None] * sq_t + dims[None, :]
        q = tl.load(Q + q_at, mask=qd_ok, other=0.0).to(DOT)
        # flag-guarded tiles: masked loads outside any `if` (async copies in the pipeline; no access when off)
        a = tl.load(ROOT + at, mask=ok & (has_root != 0), other=0.0)
        q1 = tl.load(Q1 + q_at, mask=qd_ok & (has_pair != 0), other=0.0)
        g_next = tl.load(GNEXT + at, mask=ok & (has_gnext != 0), other=0.0)
        if has_pair:
            a = _add_scores(q1.to(DOT), k1, scale, a, PRECISION)
        a = _add_scores(q, k, scale, a, PRECISION)
        do = tl.load(DO + b * sdo_b + h * sdo_h + rows[:, None] * sdo_t + dims[None, :], mask=qd_ok,
                     other=0.0).to(DOT)
        m = tl.load(M + bh * T + rows, mask=row_ok, other=0.0)
        l_inv = 1.0 / tl.load(L + bh * T + rows, mask=row_ok, other=1.0)
        delta = tl.load(DELTA + bh * T + rows, mask=row_ok, other=0.0)
        visible = _visible(rows, cols, col_ok, causal)
        logits = tl.where(visible, a / divisor, float("-inf"))
        logits = tl.where(real[None, :], logits, FILL)
        p = tl.where(row_ok[:, None], tl.exp(logits - m[:, None]) * l_inv[:, None], 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION).to(SUM)
        p_kept = p
        if dropout_p > 0:
            keep = _keep(bh, rows, pid_n * BLOCK_N, S, dropout_p, seed, offset, BLOCK_M, BLOCK_N)
            p_kept = tl.where(keep, p / (1.0 - dropout_p), 0.0)
            dp = tl.where(keep, dp / (1.0 - dropout_p), 0.0)
        dv += tl.dot(tl.trans(p_kept).to(DOT), do, input_precision=PRECISION).to(SUM)
        g = tl.where(visible & real[None, :], p * (dp - delta[:, None]) / divisor, 0.0)
        g += g_next
        tl.store(G + at, g, mask=ok)
        dk += tl.dot(tl.trans(g).to(DOT), q, input_precision=PRECISION).to(SUM)
    tl.store(DK + b * sdk_b + h * sdk_h + cols[:, None] * sdk_s + dims[None, :], (dk * scale).to(DK.dtype.element_ty),
             mask=kv_ok)
    tl.store(DV + b * sdv_b + h * sdv_h + cols[:, None] * sdv_s + dims[None, :], dv.to(DV.dtype.element_ty),
             mask=kv_ok)


@_jit
def _backward_q(G, K, DQ, sk_b, sk_h, sk_s, sdq_b, sdq_h, sdq_t, H, T, S, D, scale, skip_future,
                DOT: tl.constexpr, PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_D: tl.constexpr):
    """One block of queries: ``dq = G_n k scale``, from the ``G_n`` that ``_backward_kv`` wrote."""
    bh, pid_m = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    row_ok, dim_ok = rows < T, dims < D
    G = G + bh.to(tl.int64) * T * S
    tile = rows[:, None] * S
    dq = tl.zeros([BLOCK_M, BLOCK_D], G.dtype.element_ty)
    hi = S
    if skip_future:  # G_n is zero in the blocks wholly above the diagonal
        hi = tl.minimum((pid_m + 1) * BLOCK_M, S)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        col_ok = cols < S
        k = tl.load(K + b * sk_b + h * sk_h + cols[:, None] * sk_s + dims[None, :],
                    mask=col_ok[:, None] & dim_ok[None, :], other=0.0).to(DOT)
        g = tl.load(G + tile + cols[None, :], mask=row_ok[:, None] & col_ok[None, :], other=0.0)
        dq += tl.dot(g.to(DOT), k, input_precision=PRECISION).to(G.dtype.element_ty)
    tl.store(DQ + b * sdq_b + h * sdq_h + rows[:, None] * sdq_t + dims[None, :], (dq * scale).to(DQ.dtype.element_ty),
             mask=row_ok[:, None] & dim_ok[None, :])


@_jit
def _keep_mask(OUT, T, S, dropout_p, seed, offset, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The keep mask ``_forward`` and ``_backward_kv`` use, written out (for tests)."""
    bh, pid_m = tl.program_id(0), tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    for start_n in range(0, S, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        keep = _keep(bh, rows, start_n, S, dropout_p, seed, offset, BLOCK_M, BLOCK_N)
        tl.store(OUT + (bh.to(tl.int64) * T + rows[:, None]) * S + cols[None, :], keep.to(tl.int8),
                 mask=(rows < T)[:, None] & (cols < S)[None, :])


# --------------------------------------------------------------------------------------
# The autograd side
# --------------------------------------------------------------------------------------

EVERY = 2  # products backward re-adds at most to rebuild A_n (so A_2, A_4, ... are what a path keeps)
HIGH = 1 << 62  # seed and offset always 64-bit integers: one compiled variant
_TL_DTYPES = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32,
              torch.float64: tl.float64}


def block_config(dtype: torch.dtype, head_dim: int, capability=None, backward_kv: bool = False):
    """``(constexprs, launch options)`` of ``_forward`` and ``_backward_q`` (``backward_kv``: of
    ``_backward_kv`` and ``_delta``) for inputs of ``dtype`` and ``head_dim`` on a GPU of compute
    ``capability`` (``(major, minor)``; None: Triton's interpreter), chosen from the compiled kernels'
    spills and shared memory (docs/performance.md#compiled-for-gpus-on-the-cpu)."""
    block_d = max(16, 1 << (head_dim - 1).bit_length())  # tl.dot needs 16 at least; extra columns masked
    # Triton 3.6's interpreter multiplies bfloat16 as raw integers: there the dots run in float32
    dot = tl.float32 if INTERPRETED and dtype == torch.bfloat16 else _TL_DTYPES[dtype]
    precision = "ieee" if dtype in (torch.float32, torch.float64) else "tf32"  # tf32: ignored for half inputs
    warps = 4 if block_d <= 64 else 8
    if capability is None:  # small blocks: several per test length, interpreted quickly
        return dict(DOT=dot, PRECISION=precision, BLOCK_D=block_d, BLOCK_M=16, BLOCK_N=16), {}
    if dtype.itemsize >= 4:  # float32 (auto runs bias there), no tensor cores: 32 x 32 (at 64, spills and up to
        # 197 KB of shared memory); _backward_kv unpipelined on 8 warps (sm_86: 112 KB at d = 128 pipelined)
        return (dict(DOT=dot, PRECISION=precision, BLOCK_D=block_d, BLOCK_M=32, BLOCK_N=32),
                dict(num_warps=8, num_stages=1) if backward_kv else dict(num_warps=warps, num_stages=2))
    if not backward_kv:  # 64 x 64 (BLOCK_M == BLOCK_N: the forward's zero blocks above the diagonal assume it)
        return (dict(DOT=dot, PRECISION=precision, BLOCK_D=block_d, BLOCK_M=64, BLOCK_N=64),
                dict(num_warps=warps, num_stages=2))
    # _backward_kv spills at 64 x 64 (and 64 x 32 on sm_90): 32 x 32 (sm_80, sm_86); on sm_90 64 query rows,
    # which rebuild A_n with the forward's warpgroup MMA (wgmma, M = 64), by 16 keys
    rows, cols = (64, 16) if tuple(capability) >= (9, 0) else (32, 32)
    return (dict(DOT=dot, PRECISION=precision, BLOCK_D=block_d, BLOCK_M=rows, BLOCK_N=cols),
            dict(num_warps=warps, num_stages=2))


@functools.lru_cache(maxsize=None)
def _capability(device: torch.device):
    return torch.cuda.get_device_capability(device)


def _settings(x: torch.Tensor, head_dim: int, backward_kv: bool = False):
    """Constexprs and launch options for inputs like ``x``."""
    interpreted = INTERPRETED or x.device.type != "cuda"
    return block_config(x.dtype, head_dim, None if interpreted else _capability(x.device), backward_kv)


def philox_seed_offset(device: torch.device, count: int):
    """``(seed, offset)`` for ``count`` dropout draws from torch's default generator of ``device``,
    both in ``[2^62, 2^63)``."""
    if device.type == "cuda":
        gen = torch.cuda.default_generators[device.index if device.index is not None else torch.cuda.current_device()]
        offset = gen.get_offset()
        gen.set_offset(offset + (count + 3) // 4 * 4)
        return (gen.initial_seed() % HIGH) | HIGH, offset % HIGH | HIGH
    seed, offset = torch.randint(0, HIGH >> 1, (2,)).tolist()
    return seed | HIGH, offset | HIGH


@contextlib.contextmanager
def _interpreter_fix():
    """While our kernels are interpreted, a scalar loop bound becomes an int by taking its element
    (Triton 3.6 calls ``int()`` on a one-element array, which numpy >= 2.4 refuses)."""
    from triton.runtime import interpreter

    original = getattr(interpreter, "_patch_lang_tensor", None)
    if not INTERPRETED or original is None:
        yield
        return

    def patch(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patch
    try:
        yield
    finally:
        interpreter._patch_lang_tensor = original


def _rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` ([B, H, L, d]) with unit stride along d, as the kernels index it."""
    return x if x.stride(-1) == 1 else x.contiguous()


@functools.lru_cache(maxsize=None)
def _no_pad(device):
    return torch.zeros(1, dtype=torch.uint8, device=device)


def _launch_forward(q, k, v, prev, padding, a, out, m, l, causal, skip_future, divisor, scale, dropout_p, seed,  # noqa: E741
                    offset):
    bsz, heads, tgt_len, head_dim = q.shape
    consts, options = _settings(q, head_dim)
    with _interpreter_fix():
        _forward[(bsz * heads, triton.cdiv(tgt_len, consts["BLOCK_M"]))](
            q, k, v, a if prev is None else prev, _no_pad(q.device) if padding is None else padding, a, out, m, l,
            *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3],
            heads, tgt_len, k.size(2), head_dim, scale, divisor, dropout_p, seed, offset, int(prev is not None),
            int(padding is not None), int(causal), int(skip_future), **consts, **options)


def _launch_backward(q, k, v, out, dout, m, l, delta, g, dq, dk, dv, root, q1, k1, gnext, padding, causal,  # noqa: E741
                     skip_future, divisor, scale, dropout_p, seed, offset):
    bsz, heads, tgt_len, head_dim = q.shape
    src_len = k.size(2)
    consts, options = _settings(q, head_dim, backward_kv=True)
    with _interpreter_fix():
        _delta[(bsz * heads, triton.cdiv(tgt_len, consts["BLOCK_M"]))](
            out, dout, delta, *out.stride()[:3], *dout.stride()[:3], heads, tgt_len, head_dim,
            BLOCK_M=consts["BLOCK_M"], BLOCK_D=consts["BLOCK_D"])
        _backward_kv[(bsz * heads, triton.cdiv(src_len, consts["BLOCK_N"]))](
            q, k, v, dout, g if root is None else root, q if q1 is None else q1, k if k1 is None else k1,
            g if gnext is None else gnext, _no_pad(q.device) if padding is None else padding,
            m, l, delta, g, dk, dv, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *dout.stride()[:3],
            *dk.stride()[:3], *dv.stride()[:3], heads, tgt_len, src_len, head_dim, scale, divisor, dropout_p,
            seed, offset, int(root is not None), int(q1 is not None), int(gnext is not None),
            int(padding is not None), int(causal), int(skip_future), **consts, **options)
        consts, options = _settings(q, head_dim)
        _backward_q[(bsz * heads, triton.cdiv(tgt_len, consts["BLOCK_M"]))](
            g, k, dq, *k.stride()[:3], *dq.stride()[:3], heads, tgt_len, src_len, head_dim, scale, int(skip_future),
            **consts, **options)


def _sums(q, *shape):
    return torch.empty(*shape, dtype=torch.float64 if q.dtype == torch.float64 else torch.float32, device=q.device)


class ResidualAttention(torch.autograd.Function):
    """``(out, A_n) = f(q, k, v, A_{n-1}, padding)``; ``root``, ``q1``, ``k1``: what backward
    rebuilds ``A_n`` from."""

    @staticmethod
    def forward(ctx, q, k, v, prev, padding, root, q1, k1, causal, skip_future, divisor, scale, dropout_p):
        bsz, heads, tgt_len, head_dim = q.shape
        src_len = k.size(2)
        a, m, l = _sums(q, bsz, heads, tgt_len, src_len), _sums(q, bsz, heads, tgt_len), _sums(q, bsz, heads, tgt_len)  # noqa: E741
        out = torch.empty(tgt_len, bsz, heads, head_dim, dtype=q.dtype, device=q.device).permute(1, 2, 0, 3)
        draws = bsz * heads * tgt_len * triton.cdiv(src_len, 4)  # Philox calls
        seed, offset = philox_seed_offset(q.device, draws) if dropout_p > 0 else (HIGH, HIGH)
        _launch_forward(q, k, v, prev, padding, a, out, m, l, causal, skip_future, divisor, scale, dropout_p, seed,
                        offset)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(q, k, v, out, m, l, padding, root, q1, k1)
        ctx.settings = (None if prev is None else prev.dtype, causal, skip_future, divisor, scale, dropout_p, seed,
                        offset)
        return out, a

    @staticmethod
    def backward(ctx, dout, da):
        q, k, v, out, m, l, padding, root, q1, k1 = ctx.saved_tensors  # noqa: E741
        prev_dtype, causal, skip_future, divisor, scale, dropout_p, seed, offset = ctx.settings
        dout = torch.zeros_like(out) if dout is None else _rows(dout)
        if da is not None:
            da = da.to(m.dtype).contiguous()
        # G_n overwrites G_{n+1} where this kernel's backward made it (it passes it to no one else)
        g = da if getattr(da, "_triton_g", False) else _sums(q, *q.shape[:3], k.size(2))
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        _launch_backward(q, k, v, out, dout, m, l, torch.empty_like(m), g, dq, dk, dv, root, q1, k1, da, padding,
                         causal, skip_future, divisor, scale, dropout_p, seed, offset)
        g._triton_g = True
        dprev = None if prev_dtype is None else g.to(prev_dtype)
        return (dq, dk, dv, dprev) + (None,) * 9


def _padding(key_padding_mask):
    return None if key_padding_mask is None else key_padding_mask.to(torch.bool).contiguous().view(torch.uint8)


_PROBED = set()  # what probe() compiled and launched: (device, dtype, head dim, heads, specialization, flags)


def probe(q, k, v, prev=None, key_padding_mask=None, *, causal=False, skip_future=False, divisor=1.0, scale=1.0,
          dropout_p=0.0):
    """Compile and launch the forward and the three backward kernels once, on the first few rows of
    this call's own ``q``, ``k``, ``v`` (their strides and alignment: the variants its launches
    compile), with its flags and every flag of backward on, and wait for them; raises what Triton
    raises. Once per device, dtype, head dim, heads, specialization and set of flags."""
    q, k, v = _rows(q), _rows(k), _rows(v)
    flags = (prev is not None, key_padding_mask is not None, bool(causal), bool(causal and skip_future), dropout_p > 0)
    spec = tuple((t.data_ptr() % 16 == 0,) + tuple(s % 16 == 0 for s in t.stride()[:3]) for t in (q, k, v))
    key = (q.device, q.dtype, q.size(3), q.size(1), spec, flags)
    if key in _PROBED:
        return
    bsz, heads, _, head_dim = q.shape
    t, s = min(q.size(2), 4), min(k.size(2), 4)
    q, k, v = q[:, :, :t], k[:, :, :s], v[:, :, :s]  # dense slices: the same strides
    a, m, l = _sums(q, bsz, heads, t, s).zero_(), _sums(q, bsz, heads, t), _sums(q, bsz, heads, t)  # noqa: E741
    out = torch.zeros(t, bsz, heads, head_dim, dtype=q.dtype, device=q.device).permute(1, 2, 0, 3)
    padding = _padding(None if key_padding_mask is None else key_padding_mask[:, :s])
    with torch.no_grad():
        _launch_forward(q, k, v, a.clone() if prev is not None else None, padding, a, out, m, l, causal,
                        flags[3], divisor, scale, dropout_p, HIGH, HIGH)
        _launch_backward(q, k, v, out, torch.zeros_like(out), m, l, torch.empty_like(m), torch.empty_like(a),
                         torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), a, q, k, a.clone(), padding,
                         causal, flags[3], divisor, scale, dropout_p, HIGH, HIGH)
    if q.device.type == "cuda":
        torch.cuda.synchronize(q.device)  # a failed launch says so here
    _PROBED.add(key)


def residual_attention(q, k, v, prev=None, key_padding_mask=None, *, chain=None, causal=False, skip_future=False,
                       divisor=1.0, scale=1.0, dropout_p=0.0):
    """``(out, A_n, chain)``: ``out = dropout(softmax(mask(A_n / divisor))) v`` with
    ``A_n = (q k^T) scale + prev``; ``chain``: what the next layer of the path passes back here.

    ``q`` ``[B, H, T, d]``; ``k``, ``v`` ``[B, H, S, d]``; ``prev``: ``A_{n-1}`` ``[B, H, T, S]`` or
    None; ``key_padding_mask``: ``[B, S]``, True at padding; ``causal``: query ``i`` sees keys
    ``j <= i`` only; ``skip_future``: causal, and no row sees only padded keys."""
    q, k, v = _rows(q), _rows(k), _rows(v)
    padding = _padding(key_padding_mask)
    if prev is not None:
        prev = prev.to(torch.float64 if q.dtype == torch.float64 else torch.float32).contiguous()
    root, pairs = prev, ()
    if chain is not None and chain[0] is prev and len(chain[2]) < EVERY:  # prev = root + its pairs
        root, pairs = chain[1], chain[2]
    if pairs and (pairs[0][0].stride() != q.stride() or pairs[0][1].stride() != k.stride()):
        root, pairs = prev, ()
    pairs += ((q, k),)
    q1, k1 = pairs[0] if len(pairs) == 2 else (None, None)
    out, a = ResidualAttention.apply(q, k, v, prev, padding, root, q1, k1, bool(causal),
                                     bool(causal and skip_future), float(divisor), float(scale), float(dropout_p))
    return out, a, (a, root, pairs)


def keep_mask(shape, dropout_p: float, seed: int, offset: int, device="cpu") -> torch.Tensor:
    """The ``[B, H, T, S]`` keep mask a call with this ``seed`` and ``offset`` applies (tests)."""
    bsz, heads, tgt_len, src_len = shape
    out = torch.empty(shape, dtype=torch.int8, device=device)
    with _interpreter_fix():
        _keep_mask[(bsz * heads, triton.cdiv(tgt_len, 16))](out, tgt_len, src_len, float(dropout_p), seed, offset,
                                                              BLOCK_M=16, BLOCK_N=16)
    return out.bool()
