"""The speed benchmark's measuring helpers (the timings themselves are not unit-tested)."""

import gc
import weakref

import torch

from realformer_tools.experiments import benchmark


class _Softmax(torch.nn.Module):
    """softmax saves its own output for backward: the case that leaked graphs."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(()))
        self.outputs = []

    def forward(self, src, lengths, prev):
        y = torch.softmax(self.w * src, dim=-1)
        self.outputs.append(weakref.ref(y))
        return y.sum(), None


def test_saved_activation_bytes_counts_what_autograd_keeps_and_keeps_no_graph_alive():
    model = _Softmax()
    src = torch.randn(64, 128)
    batch = (src, None, None, None)
    nbytes = benchmark.saved_activation_bytes(model, batch)
    assert nbytes >= src.numel() * 4  # the softmax output (64 x 128 float32)
    gc.collect()
    assert model.outputs[0]() is None  # the forward's graph was freed with its output
    assert benchmark.saved_activation_bytes(model, batch) == nbytes


def test_gpu_busy_time_counts_overlapping_kernels_once():
    assert benchmark.busy_length([]) == 0.0
    assert benchmark.busy_length([(0, 2), (1, 3), (5, 6)]) == 4.0  # [0, 3] and [5, 6]
    assert benchmark.busy_length([(5, 6), (0, 10), (2, 3)]) == 10.0  # nested, unsorted


def _row(tokens, busy):
    variant = {"train_tokens_per_second": 1.0, "train_step_seconds_all": [1.0] * 15, "gpu_busy_fraction": busy,
               "train_speed_ratio": 1.0, "train_speed_low": 0.5, "train_speed_high": 1.4,
               "saved_activations_mib": 1.0}
    return {"size": "base", "tokens_per_batch": tokens, "length": 128, "dtype": "float16", "rounds": 15,
            "gpu_busy_min": busy, "host_bound": busy < benchmark.GPU_BOUND, "variants": {"vanilla": variant}}


def test_the_table_prints_tokens_per_batch_and_says_a_host_bound_row_does_not_rank_kernels():
    table = benchmark.markdown_table({"configs": [_row(8192, 0.12), _row(32768, 0.95)]})
    assert "| base | 8192 | 128 | float16 | vanilla |" in table and "| 12% |" in table
    assert "| base | 32768 | 128 | float16 | vanilla |" in table and "| 95% |" in table
    (note,) = [line for line in table.splitlines() if "host-bound" in line]
    assert "8192 tokens" in note and "does not rank kernels" in note


def test_a_cpu_row_has_every_variant_timed_per_round_with_tokens_and_dropout():
    import realformer_nmt  # noqa: F401  (registers the archs)

    row = benchmark.run_config("toy", 8, ["vanilla", "materialized"], tokens=64, alternations=2, warmup=0,
                               vocab=50, mode="sum", device="cpu", dtype=torch.float32, memory=False,
                               log=lambda m: None)
    assert row["tokens_per_batch"] == 64 and row["batch_sentences"] == 8 and row["dtype"] == "float32"
    assert row["attention_dropout"] == 0.0 and row["host_bound"] is None  # no GPU: not split
    for r in row["variants"].values():
        assert len(r["train_step_seconds_all"]) == 2 and r["gpu_busy_fraction"] is None
        assert r["train_speed_low"] <= r["train_speed_ratio"] <= r["train_speed_high"]
    assert benchmark.arch_args("big", "triton")[1].attention_dropout == 0.1  # the big arch's own default


def test_a_variant_that_fails_leaves_its_row_and_the_others_go_on(monkeypatch):
    """One variant fails while built (bias), another at its second step (materialized: a kernel
    failing on a GPU, memory): the row is measured with vanilla alone, each error kept."""
    import realformer_nmt  # noqa: F401  (registers the archs)

    build, step = benchmark.build_model, benchmark.timed_step
    steps = []

    def build_or_fail(size, variant, *args, **kwargs):
        if variant == "bias":
            raise RuntimeError("PassManager::run failed\n(the dump)")
        return build(size, variant, *args, **kwargs)

    def step_or_fail(model, *args):
        steps.append(model)
        if model.__class__.__name__.startswith("RealFormer") and steps.count(model) == 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")
        return step(model, *args)

    monkeypatch.setattr(benchmark, "build_model", build_or_fail)
    monkeypatch.setattr(benchmark, "timed_step", step_or_fail)
    row = benchmark.run_config("toy", 8, ["vanilla", "materialized", "bias"], tokens=64, alternations=3, warmup=0,
                               vocab=50, mode="sum", device="cpu", dtype=torch.float32, memory=False,
                               log=lambda m: None)
    assert list(row["variants"]) == ["vanilla"] and len(row["variants"]["vanilla"]["train_step_seconds_all"]) == 3
    assert row["failed"] == {"bias": "RuntimeError: PassManager::run failed",
                             "materialized": "OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB"}


def test_a_padded_batch_is_collated_as_fairseq_does():
    d = benchmark.make_dictionary(50)
    src, lengths, prev, tgt = benchmark.random_batch(d, 64, 16, 12, "cpu", padded=True)
    pad = d.pad()
    assert torch.equal(src.ne(pad).sum(1), lengths) and (lengths >= 8).all() and (lengths < 16).any()
    assert all(row[16 - n:].ne(pad).all() and row[:16 - n].eq(pad).all() for row, n in zip(src, lengths))  # left
    kept = tgt.ne(pad).sum(1)
    assert (kept >= 6).all() and (kept < 12).any() and torch.equal(prev.ne(pad).sum(1), kept)
    assert all(row[:n].ne(pad).all() and row[n:].eq(pad).all() for row, n in zip(tgt, kept))  # right
    plain = benchmark.random_batch(d, 4, 16, 12, "cpu")
    assert not plain[0].eq(pad).any() and torch.equal(plain[1], torch.full((4,), 16))
