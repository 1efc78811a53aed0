"""The ``triton`` kernel: layer n of a residual path as flash-style Triton kernels that read
the previous layers' running sum and write their own (this file imports triton; nothing in
the plugin imports it unless this kernel runs: ``triton_kernel.py``).

Forward, per block of query rows, over blocks of keys::

    A_n = q k^T * scale (+ A_{n-1})      stored raw and unmasked, float32 (float64 inputs:
                                         float64); the next layer reads it, and backward
    P = softmax(mask(A_n / c_n))         online; the row maximum M and sum L are saved
    out = P v

Backward recomputes ``P = exp(mask(A_n / c_n) - M) / L`` from the stored sum (no
``q k^T``); per tile ``dA_own = P * (dP - Delta) / c_n`` (zero where masked),
``G_n = dA_own + G_{n+1}`` (``G_{n+1}``: the gradient the next layer sends back through
``A_n``, absent for a path's last layer), then ``dA_{n-1} = G_n``, ``dq = G_n k scale``,
``dk = G_n^T q scale``, ``dv = P^T dO``. Dot products accumulate in float32 (float64 for
float64 inputs); half-precision inputs meet the tensor cores as they are, float32 ones in
IEEE precision (no TF32).

Masks are the materialized kernel's: padded keys (``[B, S]``, True at padding) get
float32's most negative finite logit, so a row that sees no real key attends uniformly to
the padded keys, sending no gradient to the scores; the causal mask (key index > query
index) is ``-inf``. Where a batch has no such rows, the causal kernel skips the softmax and
``P v`` of blocks wholly above the diagonal (``skip_future``); ``A_n`` is stored everywhere.

Under ``TRITON_INTERPRET=1`` (set before triton is imported) the same kernels run on CPU
tensors, in Triton's interpreter: how the CPU tests check them.
"""

import contextlib

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

INTERPRETED = type(tl.zeros).__name__ == "InterpretedFunction"  # as triton_kernel.interpreted() decides
FILL = tl.constexpr(-3.4028234663852886e38)  # torch.finfo(torch.float32).min: a padded key's logit


def _jit(fn):
    """``triton.jit``, interpreted exactly when triton's own library functions are."""
    return InterpretedFunction(fn) if INTERPRETED else JITFunction(fn)


@_jit
def _forward(Q, K, V, PREV, PAD, A, OUT, M, L, sq_b, sq_h, sq_t, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s,
             so_b, so_h, so_t, H, T, S, D, scale, divisor, DOT: tl.constexpr, PRECISION: tl.constexpr,
             HAS_PREV: tl.constexpr, HAS_PAD: tl.constexpr, CAUSAL: tl.constexpr, SKIP_FUTURE: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    SUM = A.dtype.element_ty
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    row_ok, dim_ok = rows < T, dims < D
    q = tl.load(Q + b * sq_b + h * sq_h + rows[:, None] * sq_t + dims[None, :],
                mask=row_ok[:, None] & dim_ok[None, :], other=0.0).to(DOT)
    tile = bh.to(tl.int64) * T * S + rows[:, None] * S  # this block's rows of A_n and A_{n-1}
    m_i = tl.full([BLOCK_M], float("-inf"), SUM)
    l_i = tl.zeros([BLOCK_M], SUM)
    acc = tl.zeros([BLOCK_M, BLOCK_D], SUM)
    hi = S
    if SKIP_FUTURE:  # key blocks from here on are above the diagonal for every row of the block
        hi = tl.minimum((pid_m + 1) * BLOCK_M, S)
    for start_n in range(0, hi, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        col_ok = cols < S
        k = tl.load(K + b * sk_b + h * sk_h + cols[:, None] * sk_s + dims[None, :],
                    mask=col_ok[:, None] & dim_ok[None, :], other=0.0).to(DOT)
        a = tl.dot(q, tl.trans(k), input_precision=PRECISION).to(SUM) * scale
        ok = row_ok[:, None] & col_ok[None, :]
        if HAS_PREV:
            a += tl.load(PREV + tile + cols[None, :], mask=ok, other=0.0)
        tl.store(A + tile + cols[None, :], a, mask=ok)
        if CAUSAL:
            visible = col_ok[None, :] & (cols[None, :] <= rows[:, None])
        else:
            visible = col_ok[None, :]
        logits = tl.where(visible, a / divisor, float("-inf"))
        if HAS_PAD:
            padded = tl.load(PAD + b * S + cols, mask=col_ok, other=0) != 0
            logits = tl.where(padded[None, :], FILL, logits)
        m_new = tl.maximum(m_i, tl.max(logits, 1))  # finite: every row sees key 0, real or padded
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(logits - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + b * sv_b + h * sv_h + cols[:, None] * sv_s + dims[None, :],
                    mask=col_ok[:, None] & dim_ok[None, :], other=0.0).to(DOT)
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT), v, input_precision=PRECISION).to(SUM)
        m_i = m_new
    for start_n in range(hi, S, BLOCK_N):  # above the diagonal: only the running sum
        cols = start_n + tl.arange(0, BLOCK_N)
        col_ok = cols < S
        k = tl.load(K + b * sk_b + h * sk_h + cols[:, None] * sk_s + dims[None, :],
                    mask=col_ok[:, None] & dim_ok[None, :], other=0.0).to(DOT)
        a = tl.dot(q, tl.trans(k), input_precision=PRECISION).to(SUM) * scale
        ok = row_ok[:, None] & col_ok[None, :]
        if HAS_PREV:
            a += tl.load(PREV + tile + cols[None, :], mask=ok, other=0.0)
        tl.store(A + tile + cols[None, :], a, mask=ok)
    out = acc / l_i[:, None]
    tl.store(OUT + b * so_b + h * so_h + rows[:, None] * so_t + dims[None, :], out.to(OUT.dtype.element_ty),
             mask=row_ok[:, None] & dim_ok[None, :])
    tl.store(M + bh * T + rows, m_i, mask=row_ok)
    tl.store(L + bh * T + rows, l_i, mask=row_ok)


@_jit
def _backward_kv(Q, V, DO, A, GNEXT, PAD, M, L, DELTA, G, DK, DV, sq_b, sq_h, sq_t, sv_b, sv_h, sv_s,
                 sdo_b, sdo_h, sdo_t, sdk_b, sdk_h, sdk_s, sdv_b, sdv_h, sdv_s,
                 H, T, S, D, scale, divisor, DOT: tl.constexpr, PRECISION: tl.constexpr,
                 HAS_GNEXT: tl.constexpr, HAS_PAD: tl.constexpr, CAUSAL: tl.constexpr, SKIP_FUTURE: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """One block of keys: ``G_n`` of its column of tiles (written to ``G``), ``dk`` and ``dv``."""
    pid_n, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    SUM = A.dtype.element_ty
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    col_ok, dim_ok = cols < S, dims < D
    kv_ok = col_ok[:, None] & dim_ok[None, :]
    v = tl.load(V + b * sv_b + h * sv_h + cols[:, None] * sv_s + dims[None, :], mask=kv_ok, other=0.0).to(DOT)
    real = cols >= 0
    if HAS_PAD:
        real = tl.load(PAD + b * S + cols, mask=col_ok, other=0) == 0
    dk = tl.zeros([BLOCK_N, BLOCK_D], SUM)
    dv = tl.zeros([BLOCK_N, BLOCK_D], SUM)
    base = bh.to(tl.int64) * T * S
    lo = 0
    if SKIP_FUTURE:  # query blocks before lo see none of these keys: only G_{n+1} passes there
        lo = (pid_n * BLOCK_N // BLOCK_M) * BLOCK_M
    for start_m in range(0, lo, BLOCK_M):
        rows = start_m + tl.arange(0, BLOCK_M)
        row_ok = rows < T
        ok = row_ok[:, None] & col_ok[None, :]
        g = tl.zeros([BLOCK_M, BLOCK_N], SUM)
        if HAS_GNEXT:
            g = tl.load(GNEXT + base + rows[:, None] * S + cols[None, :], mask=ok, other=0.0)
            q = tl.load(Q + b * sq_b + h * sq_h + rows[:, None] * sq_t + dims[None, :],
                        mask=row_ok[:, None] & dim_ok[None, :], other=0.0).to(DOT)
            dk += tl.dot(tl.trans(g).to(DOT), q, input_precision=PRECISION).to(SUM)
        tl.store(G + base + rows[:, None] * S + cols[None, :], g, mask=ok)
    for start_m in range(lo, T, BLOCK_M):
        rows = start_m + tl.arange(0, BLOCK_M)
        row_ok = rows < T
        ok = row_ok[:, None] & col_ok[None, :]
        qd_ok = row_ok[:, None] & dim_ok[None, :]
        q = tl.load(Q + b * sq_b + h * sq_h + rows[:, None] * sq_t + dims[None, :], mask=qd_ok, other=0.0).to(DOT)
        do = tl.load(DO + b * sdo_b + h * sdo_h + rows[:, None] * sdo_t + dims[None, :], mask=qd_ok,
                     other=0.0).to(DOT)
        m = tl.load(M + bh * T + rows, mask=row_ok, other=0.0)
        l_inv = 1.0 / tl.load(L + bh * T + rows, mask=row_ok, other=1.0)
        delta = tl.load(DELTA + bh * T + rows, mask=row_ok, other=0.0)
        a = tl.load(A + base + rows[:, None] * S + cols[None, :], mask=ok, other=0.0)
        if CAUSAL:
            visible = col_ok[None, :] & (cols[None, :] <= rows[:, None])
        else:
            visible = col_ok[None, :] & (rows[:, None] >= 0)
        logits = tl.where(visible, a / divisor, float("-inf"))
        logits = tl.where(real[None, :], logits, FILL)
        p = tl.where(row_ok[:, None], tl.exp(logits - m[:, None]) * l_inv[:, None], 0.0)
        dv += tl.dot(tl.trans(p).to(DOT), do, input_precision=PRECISION).to(SUM)
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION).to(SUM)
        g = tl.where(visible & real[None, :], p * (dp - delta[:, None]) / divisor, 0.0)
        if HAS_GNEXT:
            g += tl.load(GNEXT + base + rows[:, None] * S + cols[None, :], mask=ok, other=0.0)
        tl.store(G + base + rows[:, None] * S + cols[None, :], g, mask=ok)
        dk += tl.dot(tl.trans(g).to(DOT), q, input_precision=PRECISION).to(SUM)
    tl.store(DK + b * sdk_b + h * sdk_h + cols[:, None] * sdk_s + dims[None, :], (dk * scale).to(DK.dtype.element_ty),
             mask=kv_ok)
    tl.store(DV + b * sdv_b + h * sdv_h + cols[:, None] * sdv_s + dims[None, :], dv.to(DV.dtype.element_ty),
             mask=kv_ok)


@_jit
def _backward_q(G, K, DQ, sk_b, sk_h, sk_s, sdq_b, sdq_h, sdq_t, H, T, S, D, scale, DOT: tl.constexpr,
                PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    """One block of queries: ``dq = G_n k scale``, from the ``G_n`` that ``_backward_kv`` wrote."""
    pid_m, bh = tl.program_id(0), tl.program_id(1)
    b, h = bh // H, bh % H
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    row_ok, dim_ok = rows < T, dims < D
    tile = bh.to(tl.int64) * T * S + rows[:, None] * S
    dq = tl.zeros([BLOCK_M, BLOCK_D], G.dtype.element_ty)
    for start_n in range(0, S, BLOCK_N):
        cols = start_n + tl.arange(0, BLOCK_N)
        col_ok = cols < S
        k = tl.load(K + b * sk_b + h * sk_h + cols[:, None] * sk_s + dims[None, :],
                    mask=col_ok[:, None] & dim_ok[None, :], other=0.0).to(DOT)
        g = tl.load(G + tile + cols[None, :], mask=row_ok[:, None] & col_ok[None, :], other=0.0)
        dq += tl.dot(g.to(DOT), k, input_precision=PRECISION).to(G.dtype.element_ty)
    tl.store(DQ + b * sdq_b + h * sdq_h + rows[:, None] * sdq_t + dims[None, :], (dq * scale).to(DQ.dtype.element_ty),
             mask=row_ok[:, None] & dim_ok[None, :])


_TL_DTYPES = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32,
              torch.float64: tl.float64}


def _settings(x: torch.Tensor, head_dim: int):
    """Constexprs and launch options for inputs like ``x``."""
    block_d = max(16, triton.next_power_of_2(head_dim))  # tl.dot needs 16 at least; extra columns masked
    # Triton 3.6's interpreter multiplies bfloat16 as raw integers: there the dots run in float32
    dot = tl.float32 if INTERPRETED and x.dtype == torch.bfloat16 else _TL_DTYPES[x.dtype]
    precision = "ieee" if x.dtype in (torch.float32, torch.float64) else "tf32"  # tf32: ignored for half inputs
    if INTERPRETED or x.device.type != "cuda":  # small blocks: several per test length, interpreted quickly
        blocks, options = dict(BLOCK_M=16, BLOCK_N=16), {}
    else:
        blocks, options = dict(BLOCK_M=64, BLOCK_N=64), dict(num_warps=4 if block_d <= 64 else 8, num_stages=2)
    return dict(DOT=dot, PRECISION=precision, BLOCK_D=block_d, **blocks), options


@contextlib.contextmanager
def _interpreter_fix():
    """Triton 3.6's interpreter turns a scalar used as a loop bound into an int with ``int()`` of
    a one-element array, which numpy >= 2.4 refuses (later Triton takes the element): while
    our kernels are interpreted, it takes the element."""
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


class ResidualAttention(torch.autograd.Function):
    """``(out, A_n) = f(q, k, v, A_{n-1}, padding)``; see the module docstring."""

    @staticmethod
    def forward(ctx, q, k, v, prev, padding, causal, skip_future, divisor, scale):
        q, k, v = _rows(q), _rows(k), _rows(v)
        bsz, heads, tgt_len, head_dim = q.shape
        src_len = k.size(2)
        sum_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
        a = torch.empty(bsz, heads, tgt_len, src_len, dtype=sum_dtype, device=q.device)
        out = torch.empty_like(q)
        m = torch.empty(bsz, heads, tgt_len, dtype=sum_dtype, device=q.device)
        l = torch.empty_like(m)  # noqa: E741
        prev_dtype = None if prev is None else prev.dtype
        if prev is not None:
            prev = prev.to(sum_dtype).contiguous()
        consts, options = _settings(q, head_dim)
        grid = (triton.cdiv(tgt_len, consts["BLOCK_M"]), bsz * heads)
        with _interpreter_fix():
            _forward[grid](q, k, v, a if prev is None else prev, a if padding is None else padding, a, out, m, l,
                           *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3],
                           heads, tgt_len, src_len, head_dim, scale, divisor,
                           HAS_PREV=prev is not None, HAS_PAD=padding is not None, CAUSAL=causal,
                           SKIP_FUTURE=skip_future, **consts, **options)
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(q, k, v, out, a, m, l, padding)
        ctx.settings = (prev_dtype, causal, skip_future, divisor, scale)
        return out, a

    @staticmethod
    def backward(ctx, dout, da):
        q, k, v, out, a, m, l, padding = ctx.saved_tensors  # noqa: E741
        prev_dtype, causal, skip_future, divisor, scale = ctx.settings
        bsz, heads, tgt_len, head_dim = q.shape
        src_len = k.size(2)
        dout = torch.zeros_like(out) if dout is None else _rows(dout)
        delta = (dout.to(a.dtype) * out.to(a.dtype)).sum(-1).contiguous()  # rowsum(P * dP) = rowsum(dO * out)
        g = torch.empty_like(a)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        consts, options = _settings(q, head_dim)
        with _interpreter_fix():
            _backward_kv[(triton.cdiv(src_len, consts["BLOCK_N"]), bsz * heads)](
                q, v, dout, a, a if da is None else da.to(a.dtype).contiguous(),
                a if padding is None else padding, m, l, delta, g, dk, dv,
                *q.stride()[:3], *v.stride()[:3], *dout.stride()[:3], *dk.stride()[:3],
                *dv.stride()[:3], heads, tgt_len, src_len, head_dim, scale, divisor,
                HAS_GNEXT=da is not None, HAS_PAD=padding is not None, CAUSAL=causal, SKIP_FUTURE=skip_future,
                **consts, **options)
            _backward_q[(triton.cdiv(tgt_len, consts["BLOCK_M"]), bsz * heads)](
                g, k, dq, *k.stride()[:3], *dq.stride()[:3], heads, tgt_len, src_len, head_dim, scale, **consts,
                **options)
        return dq, dk, dv, (None if prev_dtype is None else g.to(prev_dtype)), None, None, None, None, None


def residual_attention(q, k, v, prev=None, key_padding_mask=None, *, causal=False, skip_future=False,
                       divisor=1.0, scale=1.0):
    """``(out, A_n)``: ``out = softmax(mask(A_n / divisor)) v`` with ``A_n = q k^T scale + prev``.

    ``q`` ``[B, H, T, d]``; ``k``, ``v`` ``[B, H, S, d]`` (float16, bfloat16, float32 or
    float64, all alike); ``prev``: ``A_{n-1}`` ``[B, H, T, S]`` or None (a path's first
    layer); ``key_padding_mask``: ``[B, S]``, True at padding; ``causal``: query ``i``
    sees keys ``j <= i`` only (``T == S``); ``skip_future``: causal, and no row sees only
    padded keys. ``A_n`` is float32 (float64 for float64 inputs), ``out`` in the inputs' dtype."""
    padding = None
    if key_padding_mask is not None:
        padding = key_padding_mask.to(torch.bool).contiguous().view(torch.uint8)
    return ResidualAttention.apply(q, k, v, prev, padding, bool(causal), bool(causal and skip_future),
                                   float(divisor), float(scale))
