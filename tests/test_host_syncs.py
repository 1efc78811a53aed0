"""No residual-attention kernel reads tensor values on the host per layer.

Each read of a tensor's value on the host (``bool(t.any())``, ``int(t.min())``,
``torch.equal``, ``.tolist()``, a boolean index, ...) waits for the GPU to finish
everything queued so far. Counted on CPU with a ``TorchDispatchMode`` over one training
forward + backward of a translation model built through fairseq's registries, on a batch
made by fairseq's own collater (left-padded sources, right-padded targets): every kernel
reads no more than fairseq's ``transformer`` at 2+2 and at 4+4 layers, and the count does
not grow with depth (the facts the kernels branch on are established once per forward,
``MaskFacts``). The outputs stay the materialized kernel's on such batches, also on the
batches whose facts differ (left-padded targets, ``--cross-self-attention``).
"""

import collections
import contextlib

import pytest
import torch
from conftest import build, make_dictionary
from fairseq.data import LanguagePairDataset
from torch.utils._python_dispatch import TorchDispatchMode

# ops whose result is a host value, or whose output shape depends on tensor values
HOST_READ_OPS = {"_local_scalar_dense", "item", "is_nonzero", "equal", "allclose", "nonzero", "masked_select",
                 "_unique", "_unique2", "unique_dim", "unique_consecutive", "repeat_interleave"}
# reads that do not go through the dispatcher on a CPU tensor (on CUDA each is a copy to the host)
HOST_READ_METHODS = ("tolist", "numpy", "cpu")
KERNELS = ["materialized", "bias", "auto"]
DEPTHS = [2, 4]


class HostReads(TorchDispatchMode):
    """Counts, by name, the host reads of the code run inside it."""

    def __init__(self):
        super().__init__()
        self.counts = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in HOST_READ_OPS:
            self.counts[name] += 1
        elif name in ("index", "index_put", "index_put_") and _has_bool_index(args):
            self.counts[f"{name} with a boolean mask"] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def _has_bool_index(args) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ())


@contextlib.contextmanager
def counting_host_reads():
    """A :class:`HostReads` that also counts ``Tensor.tolist/numpy/cpu`` calls."""
    reads = HostReads()
    reals = {method: getattr(torch.Tensor, method) for method in HOST_READ_METHODS}

    def counted(method):
        def read(self, *args, **kwargs):
            reads.counts[f"Tensor.{method}"] += 1
            return reals[method](self, *args, **kwargs)
        return read

    for method in HOST_READ_METHODS:
        setattr(torch.Tensor, method, counted(method))
    try:
        with reads:
            yield reads
    finally:
        for method, real in reals.items():
            setattr(torch.Tensor, method, real)


@pytest.fixture(scope="module")
def dictionary():
    return make_dictionary(30)


def fairseq_batch(dictionary, left_pad_target=False):
    """A batch as fairseq's translation task makes it: ``LanguagePairDataset``'s collater
    (sources left-padded, targets right-padded unless asked), sentences of different lengths."""
    g = torch.Generator().manual_seed(0)

    def sentence(length):
        words = torch.randint(dictionary.nspecial, len(dictionary), (length - 1,), generator=g)
        return torch.cat([words, torch.tensor([dictionary.eos()])])

    lengths = [(7, 5), (4, 8), (9, 3), (6, 6)]
    samples = [{"id": i, "source": sentence(s), "target": sentence(t)} for i, (s, t) in enumerate(lengths)]
    dataset = LanguagePairDataset(None, [s for s, _ in lengths], dictionary, None, [t for _, t in lengths],
                                  dictionary, left_pad_target=left_pad_target)
    net_input = dataset.collater(samples)["net_input"]
    return net_input["src_tokens"], net_input["src_lengths"], net_input["prev_output_tokens"]


def model(dictionary, arch, layers, kernel=None, **overrides):
    if kernel is not None:
        overrides["residual_attention_kernel"] = kernel
    return build(arch=arch, dictionary=dictionary, encoder_layers=layers, decoder_layers=layers,
                 **overrides).train()  # TINY: dropout off


def training_pass(m, src, lengths, prev):
    logits, _ = m(src, lengths, prev)
    logits.float().logsumexp(-1).mean().backward()
    return logits.detach()


def count_training_pass(m, batch) -> HostReads:
    with counting_host_reads() as reads:
        training_pass(m, *batch)
    return reads


def test_the_batch_is_padded_as_fairseq_pads_it(dictionary):
    src, _, prev = fairseq_batch(dictionary)
    pad = dictionary.pad()
    assert src[:, 0].eq(pad).any() and not src[:, -1].eq(pad).any()  # left-padded sources
    assert prev[:, -1].eq(pad).any() and not prev[:, 0].eq(pad).any()  # right-padded targets


def test_the_counter_sees_each_kind_of_host_read():
    t = torch.tensor([[1.0, 0.0], [2.0, 3.0]])
    with counting_host_reads() as reads:
        bool(t.any())
        int(t.sum())
        torch.equal(t, t)
        t.nonzero()
        t[t > 1]
        t.tolist()
    assert reads.total == 6, reads.counts
    with counting_host_reads() as none:
        (t * 2).softmax(-1).sum(-1)
    assert none.total == 0, none.counts


@pytest.fixture(scope="module")
def counts(dictionary):
    """``{(name, layers): (total, {op: count})}`` for fairseq's transformer and every kernel,
    2+2 and 4+4 layers; counted once for the tests below."""
    batch, results = fairseq_batch(dictionary), {}
    for layers in DEPTHS:
        for name in ["transformer"] + KERNELS:
            m = model(dictionary, "transformer", layers) if name == "transformer" else \
                model(dictionary, "realformer_transformer", layers, kernel=name)
            reads = count_training_pass(m, batch)
            results[name, layers] = (reads.total, dict(reads.counts))
    print("\nhost reads per training forward + backward (2+2, 4+4 layers):")
    for name in ["transformer"] + KERNELS:
        print(f"  {name:12s} " + "  ".join(f"{results[name, d][0]:3d}" for d in DEPTHS))
    return results


@pytest.mark.parametrize("layers", DEPTHS)
@pytest.mark.parametrize("kernel", KERNELS)
def test_no_kernel_reads_the_host_more_than_fairseqs_transformer(counts, kernel, layers):
    fairseq_total, _ = counts["transformer", layers]
    total, ops = counts[kernel, layers]
    assert fairseq_total > 0  # fairseq's own reads are seen (its positions, its padding checks)
    assert total <= fairseq_total, f"{kernel} at {layers}+{layers} layers: {ops} vs fairseq's {fairseq_total}"


@pytest.mark.parametrize("kernel", KERNELS)
def test_host_reads_do_not_grow_with_depth(counts, kernel):
    shallow, deep = counts[kernel, DEPTHS[0]], counts[kernel, DEPTHS[-1]]
    assert deep == shallow, f"{kernel}: {shallow} at {DEPTHS[0]}+{DEPTHS[0]} layers, {deep} at {DEPTHS[-1]}+"


@pytest.mark.parametrize("case", ["left-padded target", "cross-self-attention"])
@pytest.mark.parametrize("kernel", ["bias", "auto"])
def test_batches_with_other_mask_facts_read_once_and_equal_materialized(dictionary, kernel, case):
    """Left-padded targets (rows that see no real key, no ``is_causal`` shortcut) and
    ``--cross-self-attention`` (the decoder's masks widened over the source): the facts
    are still established once per forward, and the outputs and gradients are the
    materialized kernel's."""
    overrides = dict(cross_self_attention=True) if case == "cross-self-attention" else {}
    batch = fairseq_batch(dictionary, left_pad_target=case == "left-padded target")
    reads = {}
    for layers in DEPTHS:
        reads[layers] = count_training_pass(model(dictionary, "realformer_transformer", layers,
                                                              kernel=kernel, **overrides), batch).total
    assert reads[DEPTHS[0]] == reads[DEPTHS[-1]], reads

    ref = model(dictionary, "realformer_transformer", 3, kernel="materialized", **overrides)
    got = model(dictionary, "realformer_transformer", 3, kernel=kernel, **overrides)
    got.load_state_dict(ref.state_dict())
    want, have = training_pass(ref, *batch), training_pass(got, *batch)
    assert (have - want).abs().max() <= 1e-5 * want.abs().max()
    for (name, p), q in zip(ref.named_parameters(), got.parameters()):
        assert (q.grad - p.grad).abs().max() <= 1e-5 * max(1.0, p.grad.abs().max().item()), name


@pytest.mark.parametrize("kernel", KERNELS)
def test_bert_encoder_reads_once_per_forward_and_no_more_than_roberta(kernel):
    """``realformer_bert`` runs the same encoder loop and module (padding alone: no mask
    fact to read): one read per forward (its padding check) at every depth."""
    from bert_helpers import bert_batch, bert_dictionary, build_bert

    d = bert_dictionary()
    tokens = bert_batch(d, bsz=4)  # right-padded, as fairseq's masked-LM tasks pad

    def reads(arch, layers, **overrides):
        m = build_bert(arch, dictionary=d, encoder_layers=layers, **overrides).train()
        with counting_host_reads() as counted:
            logits, _ = m(tokens)
            logits.float().logsumexp(-1).mean().backward()
        return counted.total

    ours = {layers: reads("realformer_bert", layers, residual_attention_kernel=kernel) for layers in DEPTHS}
    assert ours[DEPTHS[0]] == ours[DEPTHS[-1]], ours
    for layers in DEPTHS:
        assert ours[layers] <= reads("roberta", layers), (layers, ours)
