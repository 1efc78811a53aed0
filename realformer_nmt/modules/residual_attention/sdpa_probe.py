"""Which SDPA backend takes the ``bias`` kernel's mask with its gradient, probed once per
device (:func:`bias_has_fused_backend`)."""

import logging
import threading
from functools import lru_cache

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)


def mask_grad_backends(device: torch.device):
    """The SDPA backends the ``bias`` kernel may run on when its mask needs a gradient.

    CUDA: only the memory-efficient kernel. It returns the gradient of a float mask;
    cuDNN attention, which PyTorch tries first on Hopper GPUs, returns only dq, dk, dv
    (no mask gradient) and has open NaN reports for float masks whose rows see no real key.
    CPU: only the math kernel (the one CPU backend that takes a float mask with a
    gradient; exact, materialized's cost, as the package docstring says)."""
    from torch.nn.attention import SDPBackend

    return [SDPBackend.EFFICIENT_ATTENTION] if device.type == "cuda" else [SDPBackend.MATH]


def _in_a_clean_thread(fn, *args):
    """``fn(*args)`` in a new thread: grad mode, inference mode, autocast and saved-tensor
    hooks (``torch.utils.checkpoint``) are thread-local, so the caller's context (a
    ``torch.no_grad()`` decoding, a checkpointed layer) cannot change the answer."""
    result, error = [], []

    def target():
        try:
            result.append(fn(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            error.append(exc)

    thread = threading.Thread(target=target, name="realformer-sdpa-probe")
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


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
    """Whether the backend of :func:`mask_grad_backends` takes a float mask with a gradient
    on ``device``, forward and backward. Probed in a thread of its own, so the answer does
    not depend on where the first call comes from (under ``torch.no_grad()`` in
    fairseq-generate, inside a checkpointed layer): it is cached for the process."""
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
    """Whether SDPA's memory-efficient backend (not the math kernel) takes a float mask that
    needs a gradient on this CUDA device, forward and backward (probed once per device)."""
    if device.type != "cuda":
        return False
    if device.index is None and torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())  # the probe's thread has its own
    return _bias_backend_probe(str(device))
