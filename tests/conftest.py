import argparse
import faulthandler
import json
import os
import signal
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch
from fairseq.data import Dictionary
from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

# The suite runs as a user does: importing the plugin installs nothing, and no switch is set
# here. A test that needs the fixes to fairseq 0.12 turns them on itself: fairseq tools started
# through the launcher (cli_helpers.run / command: python -m realformer_tools.launch, with
# --data-fixes / --bf16-decoding where a test needs those), in-process work inside
# realformer_tools.launch.fixes_installed(...).
import realformer_nmt  # noqa: E402,F401  (registers the model)

# One intra-op thread in every test process, as the tools' processes the tests start have
# (cli_env: OMP_NUM_THREADS=1). On the suite's two cores, shared by two pytest workers and
# the processes they start, torch's default of one thread per core makes tiny-model work spin
# against itself: test_paper_formula + test_triton_kernel took 690 s wall (188 s CPU) on two
# threads and 315 s (100 s CPU) on one, the same 183 tests passing. A test that needs more
# threads sets them itself.
torch.set_num_threads(1)


def _interpret_triton_here():
    """The ``triton`` kernel's CPU tests (tests/test_triton_kernel.py) run it in Triton's
    interpreter, which must be on before triton is first imported (torch imports it lazily,
    e.g. for torch.compile). Where CUDA is absent (Triton can run nothing else there), this
    process imports triton and the kernels with ``TRITON_INTERPRET=1`` and keeps the setting
    in triton's own knob (read lazily later too); the variable goes again, so the tools the
    tests start fall back as a user's would. Left alone where the variable is set already,
    where triton is imported already or not installed."""
    import importlib.util

    if (torch.cuda.is_available() or "TRITON_INTERPRET" in os.environ or "triton" in sys.modules
            or importlib.util.find_spec("triton") is None):
        return
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton

        triton.knobs.runtime.interpret = True
        import realformer_nmt.modules.residual_attention.triton  # noqa: F401
    finally:
        del os.environ["TRITON_INTERPRET"]


_interpret_triton_here()

REPO = Path(__file__).resolve().parent.parent
USER_DIR = str(REPO / "realformer_nmt")
BIN = Path(sys.executable).parent  # the venv's fairseq-train etc.

TINY = dict(
    encoder_layers=3, decoder_layers=3,
    encoder_embed_dim=16, decoder_embed_dim=16,
    encoder_ffn_embed_dim=32, decoder_ffn_embed_dim=32,
    encoder_attention_heads=4, decoder_attention_heads=4,
    dropout=0.0, attention_dropout=0.0,
)


# --------------------------------------------------------------------------------------
# The `slow` marker: `make test-fast` runs `-m "not slow"`. A test that starts a training
# process (fairseq-train, or a script or harness that runs it) must be marked slow; one
# that is not fails the moment it starts one, so the fast set cannot silently grow slow.
# --------------------------------------------------------------------------------------

TRAINING_COMMANDS = ("fairseq-train", "fairseq_cli.train", "fairseq-hydra-train", "fairseq_cli.hydra_train",
                     "torchrun", "run_demo.py", "compare_backbones.py", "compare_mlm_backbones.py",
                     "realformer_tools.experiments.gpu_check",
                     # the same as installed commands and modules (realformer_tools.cli)
                     "realformer-demo", "realformer-compare-", "realformer_tools.cli.run_demo",
                     "realformer_tools.cli.compare_")
_current_item = None
_real_popen_init = subprocess.Popen.__init__


def _words(args):
    return [str(a) for a in (args if isinstance(args, (list, tuple)) else [args])]


def starts_training(args):
    words = _words(args)
    if "--help" in words or "-h" in words:
        return False
    if words and os.path.basename(words[0]) == "make":  # make's training targets, unless only printed (-n)
        return "-n" not in words and any(w in ("demo", "gpu-check") for w in words)
    return any(name in word for word in words for name in TRAINING_COMMANDS)


def _checked_popen_init(self, args, *rest, **kwargs):
    item = _current_item
    if item is not None and starts_training(args) and item.get_closest_marker("slow") is None:
        record = os.environ.get("REALFORMER_NMT_RECORD_TRAINING")
        if record:  # development aid: list the tests that train instead of failing them
            with open(record, "a", encoding="utf-8") as f:
                f.write(json.dumps({"test": item.nodeid, "args": _words(args)}) + "\n")
        else:
            pytest.fail(f"{item.nodeid} starts a training process ({' '.join(_words(args))[:120]} ...): "
                        "mark it @pytest.mark.slow (make test-fast leaves those out)", pytrace=False)
    _real_popen_init(self, args, *rest, **kwargs)


subprocess.Popen.__init__ = _checked_popen_init


_TRAINING_FIXTURES = set()  # (module name, fixture name)


def trains(fixture_function):
    """Put under ``@pytest.fixture`` on a fixture that trains: every test that uses it,
    directly or through another fixture, is marked slow."""
    _TRAINING_FIXTURES.add((fixture_function.__module__, fixture_function.__name__))
    return fixture_function


def pytest_collection_modifyitems(config, items):
    for item in items:
        modules = (getattr(item.module, "__name__", None), __name__)
        if any((m, name) in _TRAINING_FIXTURES for name in item.fixturenames for m in modules):
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    global _current_item
    _current_item = item
    try:
        yield
    finally:
        _current_item = None


# A test not marked slow whose call takes over FAST_TEST_SECONDS gets a warning naming it (in
# the warnings summary, under xdist too); over LOAD_FACTOR times that it fails. Load makes
# times vary (up to ~6x seen on the 2-core machine), so the limit that fails is that generous
# and the warning says where a test has grown slow before it does.
FAST_TEST_SECONDS = 30
LOAD_FACTOR = 6


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.when != "call" or not report.passed or item.get_closest_marker("slow") is not None:
        return
    if call.duration > FAST_TEST_SECONDS * LOAD_FACTOR:
        report.outcome = "failed"
        report.longrepr = (f"{item.nodeid} took {call.duration:.0f}s, not marked slow: over "
                           f"{LOAD_FACTOR} x {FAST_TEST_SECONDS}s (conftest.FAST_TEST_SECONDS); make it faster or "
                           "mark it @pytest.mark.slow with its reason")
    elif call.duration > FAST_TEST_SECONDS:
        item.warn(pytest.PytestWarning(f"{item.nodeid} took {call.duration:.0f}s, not marked slow (over "
                                       f"{FAST_TEST_SECONDS}s: conftest.FAST_TEST_SECONDS)"))


# --------------------------------------------------------------------------------------
# `gpu` tests have a time limit each (issue 51: one ran for minutes and the suite never ended).
# A test past it fails with one line naming the limit, and every thread's stack is printed
# (faulthandler: also when the test is stuck in one C call, where no Python handler can run;
# the caller's own limit, gpu_check's tests step, then ends pytest). `@pytest.mark.gpu_seconds(N)`
# gives one test another limit.
# --------------------------------------------------------------------------------------

GPU_TEST_SECONDS = 45


class GpuTestTimeout(Exception):
    pass


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    if item.get_closest_marker("gpu") is None or not hasattr(signal, "setitimer"):
        yield
        return
    marker = item.get_closest_marker("gpu_seconds")
    seconds = marker.args[0] if marker else GPU_TEST_SECONDS

    def expired(signum, frame):
        raise GpuTestTimeout(f"{item.nodeid} ran past its {seconds}s limit (a gpu test; conftest.GPU_TEST_SECONDS)")

    previous = signal.signal(signal.SIGALRM, expired)
    faulthandler.dump_traceback_later(seconds + 5, exit=False)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        faulthandler.cancel_dump_traceback_later()
        signal.signal(signal.SIGALRM, previous)


# --------------------------------------------------------------------------------------
# The real corpora: a copy beside the checkout (``../shared/data``) in this workspace only.
# A clone anywhere else has none, so every test that reads one calls require_shared_data()
# first: it skips there, named, and fails only in CI, where the data is always provided.
# These are the only spellings of the path: tests/test_clone_anywhere.py checks that every
# function naming them is guarded.
# --------------------------------------------------------------------------------------

SHARED_DATA = REPO.parent / "shared" / "data"
MULTI30K = SHARED_DATA / "multi30k"
WIKITEXT2 = SHARED_DATA / "wikitext-2"


def require_shared_data(*paths):
    """Skip a test whose real corpus (under ``../shared/data``) is missing, except in CI
    (the ``CI`` environment variable set), where the data is always provided: fail there."""
    for path in paths:
        if os.path.isdir(path):
            continue
        message = f"{path} not available (the real corpus this test reads)"
        if os.environ.get("CI"):
            pytest.fail(f"{message}; CI is set, where it must be present")
        pytest.skip(message)


def attend(module, *args, prev_state=None, **kwargs):
    """Call a ResidualMultiheadAttention as the layers do: ``(output, weights, state)``, the
    previous layer's state handed in and this layer's read back through a ResidualPath."""
    from realformer_nmt.modules.residual_attention import ResidualPath

    path = ResidualPath(prev_state)
    output, weights = module(*args, residual_path=path, **kwargs)
    return output, weights, path.state


def make_dictionary(n=20):
    d = Dictionary()
    for i in range(n):
        d.add_symbol(f"w{i}")
    return d


def build(arch="realformer_transformer", dictionary=None, seed=0, **overrides):
    """Build a model through fairseq's registries, as fairseq-train does."""
    d = dictionary or make_dictionary()
    task = types.SimpleNamespace(source_dictionary=d, target_dictionary=d)
    args = argparse.Namespace(**{**TINY, **overrides})
    ARCH_CONFIG_REGISTRY[arch](args)
    torch.manual_seed(seed)
    return ARCH_MODEL_REGISTRY[arch].build_model(args, task).eval()


def batch(dictionary, bsz=3, src_len=7, tgt_len=6, seed=1, pad_rows=True):
    """Random source/target tokens; left-padded sources as fairseq's translation task makes."""
    g = torch.Generator().manual_seed(seed)
    lo, hi = dictionary.nspecial, len(dictionary)
    src = torch.randint(lo, hi, (bsz, src_len), generator=g)
    src[:, -1] = dictionary.eos()
    if pad_rows:
        src[0, :3] = dictionary.pad()
        src[1, :1] = dictionary.pad()
    tgt = torch.randint(lo, hi, (bsz, tgt_len), generator=g)
    tgt[:, 0] = dictionary.eos()  # prev_output_tokens start with EOS
    return src, src.ne(dictionary.pad()).sum(1), tgt


def cli_env():
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    # scripts run as subprocesses import this checkout's realformer_nmt (the code under
    # test), not whichever copy the venv has installed in editable mode
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    # tiny models: one intra-op thread is faster and keeps parallel runs off each other's cores
    env.setdefault("OMP_NUM_THREADS", "1")
    env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)
    return env


def _fixes_put_back():
    """Yield, then put every attribute a fix to fairseq replaces back as it was before: a module
    whose tests install fixes for good (a tools command called directly) must not hand them to
    the modules that run after it in the same worker (tests of fairseq alone among them)."""
    from inprocess import _MISSING, _patched_attributes

    before = _patched_attributes()
    yield
    for (owner, name), value in before.items():
        if value is _MISSING:
            if name in vars(owner):
                delattr(owner, name)
        elif vars(owner).get(name, _MISSING) is not value:
            setattr(owner, name, value)


@pytest.fixture(scope="module", autouse=True)
def _no_fix_outlives_its_module():
    # per module, not per test: some modules install a fix in one test for the tests after it
    yield from _fixes_put_back()


@pytest.fixture(scope="module")
def fairseq_fixes():
    """The launcher's fixes to fairseq 0.12 installed in this process for a module's tests
    (``pytestmark = pytest.mark.usefixtures("fairseq_fixes")``: tests that load checkpoints
    with fairseq's own loaders in process, under torch >= 2.6), put back after them."""
    from realformer_tools.launch import fixes_installed

    with fixes_installed(quiet=True, ranks=False):
        yield


@pytest.fixture
def dictionary():
    return make_dictionary()


@pytest.fixture(scope="session")
def data_bin(tmp_path_factory):
    """The tiny reversal corpus, binarized by fairseq-preprocess."""
    from cli_helpers import binarize, write_reversal_corpus

    raw = tmp_path_factory.mktemp("raw")
    write_reversal_corpus(raw)
    dest = tmp_path_factory.mktemp("bin")
    binarize(raw, dest)
    return dest


@pytest.fixture(scope="session")
@trains
def trained(data_bin, tmp_path_factory):
    """(save_dir, process) of a 30-update fairseq-train run of realformer_transformer."""
    from cli_helpers import TINY_FLAGS, run

    save = tmp_path_factory.mktemp("ckpt")
    proc = run(
        "fairseq-train", data_bin, "--user-dir", USER_DIR, "--arch", "realformer_transformer",
        "--residual-attention-paths", "encoder,decoder,cross", "--residual-attention-mode", "mean",
        "--max-update", 30, "--save-dir", save, *TINY_FLAGS,
    )
    return save, proc
