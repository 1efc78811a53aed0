"""Which SDPA backend takes the ``bias`` kernel's mask with its gradient, probed once per device."""

import logging
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)


def mask_grad_backends(device: torch.device):
    """The SDPA backends the ``bias`` kernel may run on when its mask needs a gradient: the
    memory-efficient kernel on CUDA, the math kernel on CPU (docs/internals.md#the-bias-kernel)."""
    from torch.nn.attention import SDPBackend

    return [SDPBackend.EFFICIENT_ATTENTION] if device.type == "cuda" else [SDPBackend.MATH]


def _in_a_clean_thread(fn, *args):
    """``fn(*args)`` in a new thread, free of the caller's thread-local grad/autocast/hook context."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="realformer-sdpa-probe") as pool:
        return pool.submit(fn, *args).result()


def _probe_once(device: str) -> bool:
    from torch.nn.attention import sdpa_kernel

    with torch.enable_grad():
        q = torch.randn(1, 1, 8, 16, device=device, dtype=torch.float16, requires_grad=True)
        bias = torch.zeros(1, 1, 8, 8, device=device, dtype=torch.float16, requires_grad=True)
        with sdpa_kernel(mask_grad_backends(torch.device(device))):
            F.scaled_dot_product_attention(q, q, q, attn_mask=bias).sum().backward()
    return bias.grad is not None


@lru_cache(maxsize=None)
def _bias_backend_probe(device: str) -> bool:
    """Whether the backend of :func:`mask_grad_backends` takes a float mask with a gradient on
    ``device``, forward and backward (cached for the process)."""
    try:
        ok = _in_a_clean_thread(_probe_once, device)
    except Exception as exc:  # noqa: BLE001 - no such backend, or no CUDA at all: either way not usable
        logger.info("SDPA probe on %s: %s", device, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        ok = False
    if not ok:
        logger.warning("SDPA's memory-efficient backend on %s does not take a float mask with a gradient: "
                       "'auto' uses materialized instead of bias there", device)
    return ok


def bias_has_fused_backend(device: torch.device) -> bool:
    """Whether SDPA's memory-efficient backend takes a float mask with a gradient on this CUDA device."""
    if device.type != "cuda":
        return False
    if device.index is None and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())  # the probe's thread has its own
    return _bias_backend_probe(str(device))
