import numpy as np
import pytest
import sympy
import torch
from memgnn.predictor.capture.capture import CaptureConfig, capture
from memgnn.predictor.emulate.kernels import choose_sdpa, mkldnn_rnn_workspace_bytes
from memgnn.predictor.spec.bundle import ModelBundle
from memgnn.predictor.spec.train import TrainSpec


def _qkv(dtype, d=64, kv_heads=4):
    q = torch.empty(2, 4, 16, d, dtype=dtype, device="meta")
    k = torch.empty(2, kv_heads, 16, d, dtype=dtype, device="meta")
    return q, k, k


def test_choose_sdpa_follows_cuda_rules():
    assert choose_sdpa(*_qkv(torch.bfloat16), None, sm=90) == "flash"
    assert choose_sdpa(*_qkv(torch.float16), None, sm=75) == "efficient"
    assert choose_sdpa(*_qkv(torch.float32), None, sm=90) == "efficient"
    mask = torch.empty(16, 16, dtype=torch.bool, device="meta")
    assert choose_sdpa(*_qkv(torch.bfloat16), mask, sm=90) == "efficient"
    assert choose_sdpa(*_qkv(torch.bfloat16, d=512), None, sm=90) == "efficient"  # no flash
    assert choose_sdpa(*_qkv(torch.bfloat16, kv_heads=2), None, sm=90) == "math"
    assert choose_sdpa(*_qkv(torch.bfloat16), None, sm=70) == "math"


def _ops(graph):
    return set(graph.paths[0].nodes["op"])


def test_cuda_target_uses_cuda_attention_kernels_and_records_scratch(tiny_gpt):
    bf16 = capture(tiny_gpt, TrainSpec.of(precision="amp-bf16"), CaptureConfig(target="cuda"))
    assert "_scaled_dot_product_flash_attention.default" in _ops(bf16)
    assert "_scaled_dot_product_flash_attention_backward.default" in _ops(bf16)
    p = bf16.paths[0]
    scratch = bf16.scratch_bytes(0, bf16.resolve_sizes({"B": 2, "S": 100}))
    bwd = [
        i
        for i, op in enumerate(p.nodes["op"])
        if op.startswith("_scaled_dot_product_flash") and "backward" in op
    ]
    # 2 heads, S rounded to 128, head dim 16 rounded to 32: softmax_d + dq_accum, fp32
    flash = 2 * 2 * 128 * 4 + 2 * 128 * 2 * 32 * 4
    assert all(int(scratch[i]) == flash for i in bwd)
    assert int(scratch.sum()) == len(bwd) * flash
    fp32 = capture(tiny_gpt, TrainSpec(), CaptureConfig(target="cuda"))
    assert "_scaled_dot_product_efficient_attention.default" in _ops(fp32)
    # the efficient backward (a dispatch hook: predictor.emulate.kernels.symbolic_hooks) keeps its
    # fp32 kernel's scratch: the 64 x 64 tile kernel's dq accumulator, ceil(100/64) x
    # ceil(16/64) tiles of 64 x 64 floats + a 16-byte lock, per (batch, head), above
    # delta = rowsum(dO * O), fp32 per (batch, head, query)
    scratch = fp32.scratch_bytes(0, fp32.resolve_sizes({"B": 2, "S": 100}))
    eff = [i for i, op in enumerate(fp32.paths[0].nodes["op"])
           if op == "_scaled_dot_product_efficient_attention_backward.default"]  # fmt: skip
    delta, workspace = 2 * 2 * 100 * 4, 2 * 2 * (2 * 1 * (4 + 64 * 64)) * 4
    assert eff and all(int(scratch[i]) == delta + workspace for i in eff)
    cpu = capture(tiny_gpt, TrainSpec(), CaptureConfig(target="cpu"))
    assert not any(
        "efficient" in op or op.startswith("_scaled_dot_product_flash_attention.")
        for op in _ops(cpu)
    )
    assert int(cpu.scratch_bytes(0, cpu.resolve_sizes({"B": 2, "S": 9})).sum()) == 0


_MKLDNN_LSTM = pytest.mark.skipif(
    not torch.backends.mkldnn.is_available(), reason="this torch build has no oneDNN"
)


def _real_workspace(t, b, i, h, dtype):
    x = torch.randn(t, b, i, dtype=dtype)
    w_ih, w_hh = torch.randn(4 * h, i, dtype=dtype), torch.randn(4 * h, h, dtype=dtype)
    b_ih, b_hh = torch.randn(4 * h, dtype=dtype), torch.randn(4 * h, dtype=dtype)
    hx, cx = torch.randn(b, h, dtype=dtype), torch.randn(b, h, dtype=dtype)
    out = torch.ops.aten.mkldnn_rnn_layer(
        x, w_ih, w_hh, b_ih, b_hh, hx, cx, False, [], 2, h, 1, True, False, False, True
    )
    return out[3].numel()


@_MKLDNN_LSTM
@pytest.mark.parametrize(
    ("t", "b", "i", "h"), [(32, 4, 16, 32), (17, 3, 16, 40), (5, 9, 70, 64), (1, 1, 3, 1)]
)
def test_mkldnn_rnn_workspace_formula_matches_the_real_op(t, b, i, h):
    assert mkldnn_rnn_workspace_bytes(t, b, i, h, elem=4) == _real_workspace(
        t, b, i, h, torch.float32
    )


@_MKLDNN_LSTM
def test_mkldnn_rnn_workspace_formula_bf16():
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        pytest.skip("this CPU has no oneDNN bf16 support")
    assert mkldnn_rnn_workspace_bytes(10, 7, 16, 48, elem=2) == _real_workspace(
        10, 7, 16, 48, torch.bfloat16
    )


def test_mkldnn_rnn_workspace_formula_takes_symbols():
    t, b = sympy.symbols("T B", positive=True, integer=True)
    expr = mkldnn_rnn_workspace_bytes(t, b, 16, 48, elem=4)
    assert expr.subs({t: 10, b: 7}) == 237568  # measured on torch 2.13's oneDNN


class _Lstm(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = torch.nn.LSTM(70, 40, num_layers=2, batch_first=True)

    def forward(self, x):
        return self.rnn(x)[0]


def _lstm_inputs(s, device, float_dtype=torch.float32):
    return {"x": torch.randn(s["B"], s["S"], 70, device=device, dtype=float_dtype)}


@_MKLDNN_LSTM
def test_cpu_target_lstm_capture_holds_the_onednn_workspace():
    bundle = ModelBundle(
        name="lstm2",
        family="test",
        build=_Lstm,
        make_inputs=_lstm_inputs,
        loss=lambda m, i: m(i["x"]).sum(),
        dims={"B": 4, "S": 9},
        static_dims=("B", "S"),
    )
    graph = capture(
        bundle, TrainSpec.of(optimizer="sgd"), CaptureConfig(symbolic=False, target="cpu")
    )
    p = graph.paths[0]
    nbytes = graph.storage_bytes(0, {"B": 4, "S": 9})
    ws = [
        int(nbytes[u])
        for i, op in enumerate(p.nodes["op"])
        if op == "mkldnn_rnn_layer.default"
        for u in np.flatnonzero(np.asarray(p.storages["alloc"]) == i)
        if p.storages["dtype"][u] == "uint8"
    ]
    layers = [
        _real_workspace(9, 4, 70, 40, torch.float32),
        _real_workspace(9, 4, 40, 40, torch.float32),
    ]
    assert layers[0] != layers[1]
    assert ws == layers * 2  # first and steady step


def test_a_value_head_dim_of_its_own_runs_the_memory_efficient_kernel():
    """Multi-head latent attention (DeepSeek-V2/V3): q and k have 192 dims, v 128. CUDA's
    flash kernel needs all three alike (sdp_utils' check_head_dim_size_flash), the
    memory-efficient one only q == k and both aligned; its output takes v's head dim."""
    q = torch.empty(2, 4, 16, 192, dtype=torch.bfloat16, device="meta")
    v = torch.empty(2, 4, 16, 128, dtype=torch.bfloat16, device="meta")
    assert choose_sdpa(q, q, v, None, sm=90) == "efficient"
    assert choose_sdpa(q.float(), q.float(), v.float(), None, sm=90) == "efficient"
    odd = torch.empty(2, 4, 16, 100, dtype=torch.bfloat16, device="meta")  # 100 % 8 != 0
    assert choose_sdpa(q, q, odd, None, sm=90) == "math"
    assert choose_sdpa(q, v, v, None, sm=90) == "math"  # q and k must agree


class _ComplexRotary(torch.nn.Module):
    """DeepSeek-V2's rotary embedding in miniature: torch.polar of position x frequency."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)
        self.register_buffer("inv_freq", torch.rand(4), persistent=False)

    def forward(self, x):
        pos = torch.arange(x.shape[1], device=x.device, dtype=torch.float32)
        freqs = pos[None, :, None] * self.inv_freq  # (1, S, 4)
        rot = torch.polar(torch.ones_like(freqs), freqs)
        h = torch.view_as_complex(self.proj(x).float().reshape(*x.shape[:2], 4, 2))
        return torch.view_as_real(h * rot).sum()


def test_polar_keeps_batch_and_sequence_symbolic():
    """torch 2.13's reference `polar` pins S to its hint; the dispatch hook keeps it a
    symbol and records one complex output of the broadcast shape (8 bytes per element)."""
    bundle = ModelBundle(
        name="rotary",
        family="test",
        build=_ComplexRotary,
        make_inputs=lambda s, device, float_dtype=torch.float32: {
            "x": torch.randn(s["B"], s["S"], 8, device=device, dtype=float_dtype)
        },
        loss=lambda m, i: m(i["x"]),
        dims={"B": 3, "S": 10},
    )
    graph = capture(bundle, TrainSpec.of(optimizer="sgd"), CaptureConfig(target="cuda"))
    assert graph.guards == []
    p = graph.paths[0]
    polar = [i for i, op in enumerate(p.nodes["op"]) if op == "polar.default"]
    assert len(polar) == 2  # one per captured step (first and steady)
    alloc = np.asarray(p.storages["alloc"])
    for b, s in ((3, 10), (5, 37)):
        nbytes = graph.storage_bytes(0, graph.resolve_sizes({"B": b, "S": s}))
        for node in polar:  # one (1, S, 4) complex64 output each
            assert [int(nbytes[u]) for u in np.flatnonzero(alloc == node)] == [s * 4 * 8]


def _tiny_mixtral(tmp_path):
    transformers = pytest.importorskip("transformers")
    from memgnn.predictor import zoo

    transformers.AutoConfig.for_model(
        "mixtral", num_hidden_layers=1, hidden_size=32, intermediate_size=64,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=64, num_local_experts=4,
        num_experts_per_tok=2,
    ).save_pretrained(str(tmp_path))  # fmt: skip
    return zoo.resolve(f"hf:{tmp_path}/config.json")


@pytest.mark.slow  # a real and a simulated step, ~10 s
def test_an_fp32_moe_captures_and_its_sim_equals_a_real_cpu_step(tmp_path):
    """transformers' grouped_mm experts in fp32: the fake rule refused them (bf16 only),
    the kernels run them (CPU here; CUDA by its fallback); the step as the CPU runs it."""
    from memgnn.dataset.profile import ProfileConfig, profile

    bundle = _tiny_mixtral(tmp_path)
    train = TrainSpec.of(steps="first")
    sizes = {"B": 2, "S": 16}
    real = profile(bundle, train, sizes, ProfileConfig(backend="cpu"))
    sim = profile(bundle, train, sizes, ProfileConfig(backend="sim", device="cpu"))
    assert sim.peak_allocated_bytes == real.peak_allocated_bytes
    graph = capture(bundle, train, CaptureConfig(target="cuda"))
    assert "_grouped_mm.default" in list(graph.paths[0].nodes["op"])


class _ChunkedSolve(torch.nn.Module):
    """The linear-attention reference kernels in miniature (Qwen3-Next's gated delta rule):
    pad S up to a multiple of the chunk, then a unit lower-triangular solve per chunk."""

    C = 8

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)

    def forward(self, x):
        h = self.proj(x)  # (B, S, 16)
        pad = (self.C - x.shape[1] % self.C) % self.C
        h = torch.nn.functional.pad(h, (0, 0, 0, pad)).reshape(x.shape[0], -1, self.C, 16)
        a = (h @ h.transpose(-1, -2)).tril(-1) * 0.01  # (B, N, C, C), row-major
        u = torch.linalg.solve_triangular(a, h, upper=False, unitriangular=True)
        return u.sum()


def _sequence_bundle(name: str, build: type[torch.nn.Module]) -> ModelBundle:
    """A test model over one (B, S, 16) input `x`, its output the loss (B=3, S=10 traced)."""
    return ModelBundle(
        name=name, family="test", build=build,
        make_inputs=lambda s, device, float_dtype=torch.float32: {
            "x": torch.randn(s["B"], s["S"], 16, device=device, dtype=float_dtype)
        },
        loss=lambda m, i: m(i["x"]), dims={"B": 3, "S": 10},
    )  # fmt: skip


@pytest.mark.slow  # real and simulated steps at three sizes, ~10 s
def test_symbolic_pads_and_triangular_solves_capture_as_the_cpu_runs_them():
    """Both ops' fake rules need concrete sizes (the pad `(C - S % C) % C`, the solve's
    batch broadcast); the hooks keep S symbolic and make the kernels' outputs: the sim
    equals a real CPU step, to the byte, at sizes the capture did not see."""
    from memgnn.dataset.profile import ProfileConfig, profile

    bundle = _sequence_bundle("chunked-solve", _ChunkedSolve)
    train = TrainSpec.of(optimizer="sgd", steps="first")
    graph = capture(bundle, train, CaptureConfig(target="cpu"))
    ops = list(graph.paths[0].nodes["op"])
    assert "constant_pad_nd.default" in ops and "linalg_solve_triangular.default" in ops
    assert not any("S ==" in g for g in graph.guards)  # S stays a symbol
    for sizes in ({"B": 2, "S": 13}, {"B": 3, "S": 16}, {"B": 1, "S": 41}):
        real = profile(bundle, train, sizes, ProfileConfig(backend="cpu"))
        sim = profile(bundle, train, sizes, ProfileConfig(backend="sim", device="cpu"))
        assert sim.peak_allocated_bytes == real.peak_allocated_bytes, sizes


class _TimeShift(torch.nn.Module):
    """RWKV's token shift (`ZeroPad2d((0, 0, 1, -1))`: one step back, the last dropped) and
    Mamba2's chunk-decay pad (`F.pad(x, (1, 0))`, a constant pad of a symbolic input)."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(16, 16)
        self.shift = torch.nn.ZeroPad2d((0, 0, 1, -1))

    def forward(self, x):
        h = self.proj(x)  # (B, S, 16)
        shifted = self.shift(h)  # negative pad: the kernel narrows first
        edge = torch.nn.functional.pad(h[:, :, -1], (1, 0))  # (B, S + 1)
        return (shifted * h).sum() + edge.exp().sum()


@pytest.mark.slow  # real and simulated steps at two sizes, ~10 s
def test_negative_and_constant_pads_keep_sizes_symbolic_and_equal_a_real_cpu_step():
    """A negative pad failed under fake tensors ("Cannot call storage_offset() on tensor
    with symbolic sizes"), a constant one pinned B and S to their hints; the hook makes
    the kernel's one output. The symbolic graph, simulated at sizes it was not traced at,
    equals a real CPU step to the byte."""
    from memgnn.dataset.profile import ProfileConfig, profile

    bundle = _sequence_bundle("time-shift", _TimeShift)
    train = TrainSpec.of(optimizer="sgd", steps="first")
    graph = capture(bundle, train, CaptureConfig(target="cpu"))
    assert graph.guards == []  # neither B nor S pinned
    assert list(graph.paths[0].nodes["op"]).count("constant_pad_nd.default") >= 2
    sim_config = ProfileConfig(backend="sim", device="cpu")
    for sizes in ({"B": 2, "S": 13}, {"B": 5, "S": 41}):
        real = profile(bundle, train, sizes, ProfileConfig(backend="cpu"))
        sim = profile(bundle, train, sizes, sim_config, graph=graph)
        assert sim.stats["label_graph"] == "symbolic"
        assert sim.peak_allocated_bytes == real.peak_allocated_bytes, sizes
