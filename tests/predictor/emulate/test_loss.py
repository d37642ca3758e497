"""`--loss chunked-ce:N` (`predictor.emulate.loss`): torchtune's CEWithChunkedOutputLoss
with its model's chunked output, checked against a real CPU step (memgnn's CPU recorder),
against the model's own loss by the bytes the chunking saves (a hand formula), and, compiled
per chunk (torchtune's compile_loss), against a real `torch.compile`d CPU step."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from memgnn.dataset.profile import ProfileConfig, profile
from memgnn.predictor.capture.capture import CaptureConfig, capture
from memgnn.predictor.emulate.loss import ChunkedCrossEntropy, split_sequence
from memgnn.predictor.errors import UserError
from memgnn.predictor.memory.analytic import sweep
from memgnn.predictor.spec.train import TrainSpec
from memgnn.predictor.zoo import resolve
from tiny_models import tiny_gpt_bundle

# a logits-heavy llama: B x S x vocab = 2 x 64 x 8192 = 1,048,576 logits
VOCAB, SIZES = 8192, {"B": 2, "S": 64}
LOGITS = SIZES["B"] * SIZES["S"] * VOCAB


def _llama():
    args = {"hidden": "16", "vocab": str(VOCAB), "heads": "2", "kv_heads": "1", "ffn": "32"}
    return resolve("llama", args)


def _profile(train: TrainSpec, backend: str, sizes=SIZES):
    config = ProfileConfig(backend=backend, **({"device": "cpu"} if backend == "sim" else {}))
    return profile(_llama(), train, sizes, config)


@pytest.mark.parametrize(
    ("loss", "seq"),
    [pytest.param("chunked-ce:8", 64, marks=pytest.mark.slow), ("chunked-ce:3", 21)],
)
def test_the_chunked_loss_equals_a_real_cpu_step(loss, seq):
    train = TrainSpec.of(loss=loss, precision="bf16", optimizer="sgd")
    sizes = {"B": 2, "S": seq}
    real, sim = _profile(train, "cpu", sizes), _profile(train, "sim", sizes)
    assert sim.peak_allocated_bytes == real.peak_allocated_bytes
    assert sim.breakdown["tensor_phase_peaks"] == real.breakdown["tensor_phase_peaks"]


def test_chunking_lowers_the_forward_peak_by_the_upcast_logits():
    """Hand formula (bf16, E = B*S*vocab logits): the model's own loss peaks in forward at
    its bf16 logits (2E bytes) + their fp32 upcast (4E) + log_softmax's fp32 output (4E,
    saved for backward); chunked over N, all bf16 chunks (2E) + every chunk's saved
    log_softmax (4E) + one chunk's upcast (4E/N). Lower by 4E(1 - 1/N) bytes, to within
    the per-chunk labels and loss scalars (measured: 1,064 B at N=8, 1,048 B at N=4)."""
    peaks = {}
    for loss in ("model", "chunked-ce:8"):
        train = TrainSpec.of(loss=loss, precision="bf16", optimizer="sgd")
        peaks[loss] = _profile(train, "sim").breakdown["tensor_phase_peaks"]
    for n in (8,):
        saved = peaks["model"]["forward"] - peaks[f"chunked-ce:{n}"]["forward"]
        assert saved == pytest.approx(4 * LOGITS * (1 - 1 / n), abs=2048)
    # backward: the model's own loss holds its fp32 log_softmax, nll_loss's gradient and
    # log_softmax's gradient of the whole sequence at once; the chunked one a chunk's
    assert peaks["chunked-ce:8"]["backward"] < peaks["model"]["backward"] - 4 * LOGITS


@pytest.mark.slow
def test_the_compiled_chunk_keeps_no_fp32_logits():
    """Compiled per chunk (torchtune's compile_loss): AOTAutograd's partitioner saves the
    chunk's bf16 logits (alive anyway) and recomputes the upcast and softmax in backward,
    so the forward ends holding the bf16 chunks (2E) and little else, where eager holds
    every chunk's fp32 log_softmax (4E) besides."""
    base = TrainSpec.of(loss="chunked-ce:8", precision="bf16", optimizer="sgd")
    eager = _profile(base, "sim").breakdown["tensor_phase_peaks"]
    compiled = _profile(base.with_options(compile="blocks"), "sim").breakdown
    before = compiled["tensor_phase_peaks"]["input"]
    assert compiled["tensor_phase_peaks"]["forward"] - before < 2 * LOGITS * 1.15
    assert eager["forward"] - before > 6 * LOGITS


@pytest.mark.slow
@pytest.mark.parametrize(
    "options",
    [
        {"loss": "chunked-ce:8"},
        {"compile_loss": True},
        {"compile_loss": True, "compile_dynamic": False},
    ],
    ids=["chunked-ce", "compile-loss", "compile-loss-static"],
)
def test_compiled_loss_step_equals_a_real_compiled_cpu_step(options):
    """A real `torch.compile` (inductor, CPU) steady step: torch.profiler's allocator peak
    plus the state alive before it, against the capture's peak (as test_compile), bf16,
    SGD. The chunked loss compiled per chunk: 3,560,364 B both (before the capture ran
    inductor's own wrapper it was high by 261,952 B, one bf16 chunk of logits less 192 B
    that inductor's buffer reuse saves in backward). The model's own loss compiled
    (`--compile-loss`): 7,491,948 B both with dynamic shapes, 5,394,796 B both static (a
    static compile saves the bf16 logits where the dynamic one saves their fp32 upcast);
    the same step with the loss eager holds more than either."""
    from memgnn.dataset.cpu_backend import compiled_afresh, profiler_peak
    from memgnn.predictor.capture.step import TrainingStep
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    train = TrainSpec.of(
        compile="blocks", precision="bf16", optimizer="sgd", steps="steady", **options
    )
    torch._dynamo.reset()
    torch.manual_seed(0)
    step = TrainingStep(_llama(), train, device=torch.device("cpu"), target="cpu")
    with compiled_afresh():
        step.run(SIZES, steps=(0,))
    before = sum(t.untyped_storage().nbytes() for ts in step.state_tensors().values() for t in ts)
    # oneDNN's bf16 GEMMs (CPUs with AVX512-BF16 or AMX) allocate packing scratchpads inside
    # the kernel, which a CPU-target capture does not model (a weight-sized one per lm_head
    # chunk here: +1,050,684 B on such a CPU); the reference GEMM, which CPUs without bf16
    # run anyway, allocates none
    with (
        torch.backends.mkldnn.flags(enabled=False),
        torch_profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof,
    ):
        step.run(SIZES, steps=(1,))
    real = before + profiler_peak(prof)
    config = CaptureConfig(target="cpu", mode="full", sizes=SIZES)
    predicted = sweep(capture(_llama(), train, config), SIZES).peak_bytes
    assert predicted == real
    if options.get("compile_loss"):
        eager_loss = TrainSpec.of(**{**train.flat(), "compile_loss": False})
        assert sweep(capture(_llama(), eager_loss, config), SIZES).peak_bytes > predicted


def test_compile_loss_is_checked():
    TrainSpec.of(compile="blocks", compile_loss=True)
    with pytest.raises(ValueError, match="--compile-loss with --compile none"):
        TrainSpec.of(compile_loss=True)
    with pytest.raises(ValueError, match="--compile-loss with --compile full"):
        TrainSpec.of(compile="full", compile_loss=True)
    with pytest.raises(ValueError, match="--compile-loss with --loss chunked-ce:8"):
        TrainSpec.of(compile="blocks", compile_loss=True, loss="chunked-ce:8")


def test_the_chunks_are_tensor_splits():
    for s in (1, 7, 8, 21, 64):
        x = torch.arange(2 * s).reshape(2, s)
        ours = split_sequence(x, 8)
        assert len(ours) == 8
        for a, b in zip(ours, x.tensor_split(8, dim=1), strict=True):
            assert torch.equal(a, b)


def test_a_chunk_loss_is_torchtunes_sum_of_fp32_cross_entropy():
    logits = torch.randn(6, 11, dtype=torch.bfloat16)
    labels = torch.tensor([1, 2, -100, 4, 5, 6])
    want = F.cross_entropy(logits.float(), labels, ignore_index=-100, reduction="sum")
    assert torch.equal(ChunkedCrossEntropy()(logits, labels), want)


def test_the_chunked_loss_value_is_the_models_own():
    """The same weights and batch: the chunked loss equals transformers' mean cross entropy."""
    from memgnn.predictor.capture.step import TrainingStep

    torch.manual_seed(0)
    plain = TrainingStep(_llama(), TrainSpec.of(), device=torch.device("cpu"), target="cpu")
    chunked = TrainingStep(
        _llama(), TrainSpec.of(loss="chunked-ce:8"), device=torch.device("cpu"), target="cpu"
    )
    chunked.model.load_state_dict(plain.model.state_dict())
    inputs = plain.bundle.make_inputs({"B": 2, "S": 21}, torch.device("cpu"), torch.float32)
    want = plain.loss_fn(plain.model, inputs)
    got = chunked.loss_fn(chunked.model, inputs)
    assert got.item() == pytest.approx(want.item(), rel=1e-5)


def test_the_loss_option_is_checked():
    for bad in ("chunked-ce", "chunked-ce:0", "chunked", "ce:8"):
        with pytest.raises(ValueError, match="--loss"):
            TrainSpec.of(loss=bad)
    with pytest.raises(ValueError, match="one GPU and with ddp or fsdp"):
        TrainSpec.of(loss="chunked-ce:8", sharding="zero2", gpus=2)
    TrainSpec.of(loss="chunked-ce:8", sharding="fsdp", gpus=2)
    with pytest.raises(ValueError, match="--compile full with --loss"):
        TrainSpec.of(loss="chunked-ce:8", compile="full")
    assert TrainSpec.of(loss="chunked-ce:8").kernels.loss_chunks == 8
    assert TrainSpec.of().kernels.loss_chunks is None


def test_a_model_without_an_output_head_is_refused():
    with pytest.raises(UserError, match="--loss chunked-ce:8"):
        _profile_bundle(tiny_gpt_bundle())


def _profile_bundle(bundle):
    train = TrainSpec.of(loss="chunked-ce:8")
    return profile(bundle, train, {"B": 2, "S": 8}, ProfileConfig(backend="sim", device="cpu"))
