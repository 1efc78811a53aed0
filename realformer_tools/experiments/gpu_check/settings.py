"""What the device run runs and judges by: its sections in priority order with each one's
deadline, the sizes of the real run and of the dry run, and the targets (docs/gpu.md)."""

import dataclasses
import os
from typing import Dict, List

import realformer_nmt

REPO = os.path.dirname(os.path.dirname(os.path.abspath(realformer_nmt.__file__)))
USER_DIR = os.path.dirname(os.path.abspath(realformer_nmt.__file__))
DEFAULT_OUT = os.path.join("runs", "gpu_check", "out")
DRY_RUN_OUT = os.path.join("runs", "gpu_check_dry_run", "out")

# in priority order: what a session cut short must have answered first (the rows that decide the
# default, then exactness, training, two ranks; the triton kernel's tests with what is left)
SECTIONS = ("speed", "exactness", "train", "ddp", "tests")
# the whole command's default budget: one device command may run 10 minutes; the device script
# (BUDGET 570 s) gives set-up up to SETUP_SECONDS (gpu_machine_setup.sh measured 28 s and 37 s on an
# H100) and keeps 15 s for packing the logs: the sections get 570 less the seconds spent before them
# (nvidia-smi, set-up, torch's and Triton's import) less 15, about 570 - 60 - 15 after a full set-up
SETUP_SECONDS = 60
BUDGET_SECONDS = 495
# precision -> fairseq-train flags
PRECISIONS = {"fp32": [], "fp16": ["--fp16"], "bf16": ["--bf16"]}  # through realformer-fairseq: no other flag
TRAIN_KERNELS = ("vanilla", "bias", "triton")  # vanilla: fairseq's own transformer
# the triton kernel's tests on CUDA: its float32 cases (Triton cannot compile a float64 dot product
# for sm90; the float64 tests run in float32 on CUDA)
TRITON_TESTS = ["tests/test_triton_kernel.py", "-k", "float32 or float64 or head_dims or dropout"]
GPU_TESTS = ["tests/test_gpu.py", "-m", "gpu"]  # the dry run collects the triton tests only (CI time)

# the speed targets of docs/performance.md: (row, variant, least speed ratio, most memory ratio)
SPEED_TARGETS = (
    (dict(size="base", tokens_per_batch=32768), "triton", 1.00, 1.00),
    (dict(size="big", tokens_per_batch=32768), "triton", 0.98, None),
)
FIRST_PASS_SLACK = 1.10  # the first pass over new lengths: at most vanilla's + 10%
# mixed precision, judged against vanilla's own cost measured the same way: the fp32 checkpoint
# evaluated in fp16 / bf16, its valid nll's shift within max(0.5%, 1.5x vanilla's)
PRECISION_SHIFT_FLOOR = 0.005
PRECISION_SHIFT_FACTOR = 1.5
# two ranks: start-up plus steps, then this long after rank 0's "done training" for the exit
DDP_EXIT_SECONDS = 20


@dataclasses.dataclass
class Sizes:
    """How big each section runs: on the GPU, or the dry run's tiny version on the CPU."""

    deadlines: Dict[str, float]  # seconds each section may take at most
    speed_calls: List[List[str]]  # scripts/benchmark_speed.py arguments, one call each, in order
    exact: Dict[str, int]
    data: str
    synthetic_sizes: Dict[str, int]
    vocab: int
    model_flags: List[str]
    max_tokens: int
    warmup_updates: int
    train_updates: int
    ddp_updates: int
    log_interval: int
    train_precisions: List[str]
    train_kernels: List[str]
    jobs: int


MODEL = ("--encoder-layers 3 --decoder-layers 3 --encoder-embed-dim 256 --decoder-embed-dim 256 "
         "--encoder-ffn-embed-dim 512 --decoder-ffn-embed-dim 512 "
         "--encoder-attention-heads 4 --decoder-attention-heads 4 --share-all-embeddings")
REAL = Sizes(
    # H100, 2026-11-28: triton's tests ~8 s each (mostly compiling); the speed benchmark 76 s for six
    # variants at 4k tokens; exactness 134 s uncut (four kernels, float64 proof, triton compiling); six
    # fairseq-train runs of 300 updates at a time 64-77 s each; two ranks 33 s. Their sum fits BUDGET_SECONDS
    # (tests/test_gpu_check.py): every section is reached even if each one runs to its deadline
    deadlines=dict(speed=240, exactness=75, train=90, ddp=40, tests=40),
    speed_calls=[  # the rows that decide the default, at 32k tokens (GPU-bound), in this order
        "--sizes big --tokens 32768 --lengths 128 --dtypes float16,bfloat16 --variants vanilla,bias,triton "
        "--alternations 10".split(),
        "--sizes base --tokens 32768 --lengths 128,512 --dtypes float16,bfloat16 --variants vanilla,bias,triton "
        "--alternations 10".split(),
        "--sizes base --tokens 32768 --lengths 128,512 --dtypes float16 --variants vanilla,bias,triton "
        "--alternations 10 --padded".split(),
    ],
    exact=dict(layers=6, embed=256, heads=4, vocab=200, batch=8, src_len=40, tgt_len=36),
    data=os.path.join("data-bin", "demo_en_de"), synthetic_sizes={}, vocab=1000,  # make demo's corpus
    model_flags=MODEL.split(), max_tokens=2048, warmup_updates=100, train_updates=200, ddp_updates=30, log_interval=25,
    train_precisions=["fp16", "bf16"], train_kernels=list(TRAIN_KERNELS), jobs=6,  # fp32 triton: slow, not auto's
)
DRY = Sizes(
    # a shared CPU: generous; the budget is judged on the real deadlines (DeviceRun's clock)
    deadlines=dict(speed=120, exactness=120, train=240, ddp=120, tests=120),
    speed_calls=["--sizes toy --tokens 64 --lengths 8 --dtypes float32,bfloat16 --variants vanilla,materialized,bias "
                 "--alternations 2 --warmup 0 --vocab 50 --no-memory".split(),
                 "--sizes toy --tokens 64 --lengths 8 --dtypes bfloat16 --variants vanilla,materialized,bias "
                 "--alternations 2 --warmup 0 --vocab 50 --no-memory --padded".split()],
    exact=dict(layers=2, embed=16, heads=4, vocab=30, batch=3, src_len=8, tgt_len=6),
    data=None, synthetic_sizes=dict(n_train=300, n_valid=20, n_test=20), vocab=120,
    model_flags=("--encoder-layers 2 --decoder-layers 2 --encoder-embed-dim 16 --decoder-embed-dim 16 "
                 "--encoder-ffn-embed-dim 32 --decoder-ffn-embed-dim 32 --encoder-attention-heads 2 "
                 "--decoder-attention-heads 2 --share-all-embeddings").split(),
    max_tokens=512, warmup_updates=4, train_updates=6, ddp_updates=8, log_interval=1,
    train_precisions=["fp32", "bf16"], train_kernels=["vanilla", "bias"], jobs=2,
)
GPU_BOUND_NOTE = ("A row whose GPU is busy less than 80% of a step (host-bound) times Python and kernel launches: "
                  "it does not rank kernels, and the CUDA rule for auto is derived from the other rows only.")
