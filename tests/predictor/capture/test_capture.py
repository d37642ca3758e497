import math

import pytest
import torch
from memgnn.predictor.capture.branches import CaptureError
from memgnn.predictor.capture.capture import CaptureConfig, capture
from memgnn.predictor.ir.vocab import CATEGORIES
from memgnn.predictor.spec.train import TrainSpec

SIZES = [(3, 17), (1, 5), (64, 1024)]


def _bytes_equal(sym, conc, sizes):
    a = sym.storage_bytes(0, sym.resolve_sizes(sizes))
    b = conc.storage_bytes(0, conc.resolve_sizes(sizes))
    return sym.paths[0].nodes["op"] == conc.paths[0].nodes["op"] and list(a) == list(b)


def _memory_equal(sym, conc, sizes):
    """Same storages in the same order, same ops but for aliases: eager indexing skips an
    open slice that a symbolic trace records as an alias
    (`predictor.emulate.kernels.eager_hooks`)."""
    # data-dependent sizes (MoE routing) at the scenario the concrete capture ran with
    a = sym.storage_bytes(0, sym.resolve_sizes(sizes, "balanced"))
    b = conc.storage_bytes(0, conc.resolve_sizes(sizes, "balanced"))
    ops = [[op for op in g.paths[0].nodes["op"] if op != "alias.default"] for g in (sym, conc)]
    return ops[0] == ops[1] and list(a) == list(b)


@pytest.mark.parametrize("train", [TrainSpec(), TrainSpec.of(precision="amp-bf16", grad_accum=3)])
def test_symbolic_capture_matches_concrete_captures(tiny_gpt, train):
    sym = capture(tiny_gpt, train)
    assert sym.meta["symbolic"] and "B" in sym.symbols
    for b, s in SIZES:
        conc = capture(tiny_gpt, train, CaptureConfig(symbolic=False, sizes={"B": b, "S": s}))
        assert _bytes_equal(sym, conc, {"B": b, "S": s}), (b, s)


def test_capture_records_all_phases_and_both_steps(tiny_gpt):
    g = capture(tiny_gpt, TrainSpec())
    p = g.paths[0]
    assert set(p.nodes["step"]) == {0, 1}
    assert set(p.nodes["phase"]) >= {1, 2, 3, 4, 5}  # input forward backward optimizer zero_grad
    cats = {CATEGORIES[c] for c in p.storages["category"]}
    assert cats == set(CATEGORIES) - {"comm"}  # comm: collective buffers of a sharded step
    edges = p.edges()
    assert edges.shape[0] == 2 and edges.shape[1] > p.num_nodes // 2
    assert (edges[0] < edges[1]).all()


def _state_bytes(g, category):
    p = g.paths[0]
    sizes = g.resolve_sizes(g.symbols)
    nbytes = g.storage_bytes(0, sizes)
    code = CATEGORIES.index(category)
    return sum(
        int(nbytes[u])
        for u in range(p.num_storages)
        if p.storages["category"][u] == code and p.storages["free"][u] == -1
    )


def _expected_state(model, optimizer):
    total = 0
    for prm in model.parameters():
        n, size = prm.numel(), prm.element_size()
        if optimizer == "sgd":
            total += n * size  # momentum buffer
        elif optimizer in ("adam", "adamw"):
            total += 2 * n * size + 4  # exp_avg, exp_avg_sq, fp32 step on the CPU
        else:  # adafactor: factored second moment for >= 2-D, full for 1-D, step
            shape = list(prm.shape)
            if prm.dim() > 1:
                total += math.prod(shape[:-1]) * size + math.prod(shape[:-2] + shape[-1:]) * size
            else:
                total += n * size
            total += 4
    return total


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "adamw", "adafactor"])
def test_parameter_gradient_and_optimizer_bytes_match_analytic_count(tiny_gpt, optimizer):
    g = capture(tiny_gpt, TrainSpec.of(optimizer=optimizer), CaptureConfig(target="cpu"))
    model = tiny_gpt.build()
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert _state_bytes(g, "parameter") == param_bytes
    assert _state_bytes(g, "optimizer_state") == _expected_state(model, optimizer)
    kept = capture(
        tiny_gpt, TrainSpec.of(optimizer=optimizer, set_to_none=False), CaptureConfig(target="cpu")
    )
    assert _state_bytes(kept, "gradient") == param_bytes  # zeroed grads are kept


def test_cuda_target_keeps_adam_step_counters_on_host(tiny_gpt):
    cpu = capture(tiny_gpt, TrainSpec(), CaptureConfig(target="cpu"))
    cuda = capture(tiny_gpt, TrainSpec(), CaptureConfig(target="cuda"))
    n_params = len(list(tiny_gpt.build().parameters()))
    diff = _state_bytes(cpu, "optimizer_state") - _state_bytes(cuda, "optimizer_state")
    assert diff == 4 * n_params


def test_pure_bf16_halves_parameter_bytes(tiny_gpt):
    fp32 = capture(tiny_gpt, TrainSpec.of(steps="first"))
    bf16 = capture(tiny_gpt, TrainSpec.of(precision="bf16", steps="first"))
    assert _state_bytes(bf16, "parameter") * 2 == _state_bytes(fp32, "parameter")


def test_checkpointing_lowers_activation_peak(tiny_gpt):
    from memgnn.predictor.memory.analytic import sweep

    sizes = {"B": 8, "S": 256}
    plain = sweep(capture(tiny_gpt, TrainSpec()), sizes)
    ckpt = sweep(capture(tiny_gpt, TrainSpec.of(checkpointing="full")), sizes)
    assert ckpt.best.breakdown["activation"] < plain.best.breakdown["activation"]
    assert ckpt.peak_bytes < plain.peak_bytes


def test_steady_only_registers_optimizer_state_before_the_step(tiny_mlp):
    g = capture(tiny_mlp, TrainSpec.of(steps="steady"))
    p = g.paths[0]
    assert set(p.nodes["step"]) == {1}
    pre = [CATEGORIES[c] for c, a in zip(p.storages["category"], p.storages["alloc"]) if a < 0]
    assert "optimizer_state" in pre and "parameter" in pre


def test_data_dependent_scalar_fails_naming_module():
    from memgnn.predictor.spec.bundle import ModelBundle

    class Bad(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            n = int(x.argmax())  # data-dependent integer
            return self.lin(x)[:, : n + 1].sum()

    bundle = ModelBundle(
        name="bad",
        family="bad",
        build=Bad,
        make_inputs=lambda s, d, t: {"x": torch.randn(s["B"], 4, device=d)},
        loss=lambda m, i: m(i["x"]),
        dims={"B": 2},
    )
    with pytest.raises(CaptureError, match=r"_local_scalar_dense|module"):
        capture(bundle, TrainSpec())


def test_size_not_in_input_spec_is_named(tiny_mlp):
    with pytest.raises(ValueError, match="'S' is not an input dim"):
        capture(tiny_mlp, TrainSpec(), CaptureConfig(sizes={"S": 4}))
    with pytest.raises(ValueError, match="must be >= 1"):
        capture(tiny_mlp, TrainSpec(), CaptureConfig(sizes={"B": -2}))


@pytest.mark.parametrize(
    "name, hparams, points",
    [
        ("bert", {"dropout": 0.0}, [{"B": 2, "S": 16}, {"B": 5, "S": 128}, {"B": 9, "S": 300}]),
        ("resnet", {}, [{"B": 2}, {"B": 5}, {"B": 12}]),  # guard B < 16 (conv backend)
        ("llama", {}, [{"B": 2, "S": 7}, {"B": 5, "S": 128}, {"B": 9, "S": 300}]),
        ("t5", {"dropout": 0.0}, [{"B": 2, "S": 7, "T": 5}, {"B": 3, "S": 33, "T": 17}]),
        ("moe", {}, [{"B": 2, "S": 7}, {"B": 5, "S": 64}]),
    ],
)
def test_zoo_symbolic_capture_matches_concrete(name, hparams, points):
    from memgnn.predictor.zoo import make_bundle

    bundle = make_bundle(name, hparams)
    train = TrainSpec.of(steps="first")
    sym = capture(bundle, train, CaptureConfig(target="cpu"))
    for sizes in points:
        assert not sym.violated_guards(sym.resolve_sizes(sizes))
        conc = capture(bundle, train, CaptureConfig(target="cpu", symbolic=False, sizes=sizes))
        assert _memory_equal(sym, conc, sizes), (name, sizes)


@pytest.mark.parametrize(
    "model_type, task, kwargs",
    [
        # ALiBi: baddbmm of a broadcast bias, whose fake rule fails on symbolic sizes
        ("bloom", "causal-lm", dict(n_layer=2, hidden_size=32, n_head=2, vocab_size=64)),
        # no SDPA attention: built with eager attention
        (
            "deberta-v2",
            "masked-lm",
            dict(
                num_hidden_layers=2,
                hidden_size=32,
                num_attention_heads=2,
                intermediate_size=64,
                vocab_size=64,
                max_position_embeddings=64,
                hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0,
            ),
        ),
    ],
)
def test_hf_architectures_without_sdpa_capture_symbolically(tmp_path, model_type, task, kwargs):
    transformers = pytest.importorskip("transformers")
    from memgnn.predictor.zoo import resolve

    folder = tmp_path / model_type
    transformers.AutoConfig.for_model(model_type, **kwargs).save_pretrained(str(folder))
    bundle = resolve(f"hf:{folder}", task=task)
    train = TrainSpec.of(steps="first")
    sym = capture(bundle, train, CaptureConfig(target="cpu"))
    for sizes in ({"B": 2, "S": 7}, {"B": 3, "S": 40}):
        assert not sym.violated_guards(sym.resolve_sizes(sizes))
        conc = capture(bundle, train, CaptureConfig(target="cpu", symbolic=False, sizes=sizes))
        assert _memory_equal(sym, conc, sizes), (model_type, sizes)


def test_trained_attention_bias_captures_symbolically_on_a_cuda_target():
    # T5's relative position bias takes a gradient in full fine-tuning: the memory-efficient
    # SDPA backward's meta rule failed on symbolic sizes (predictor.emulate.kernels.symbolic_hooks)
    from memgnn.predictor.zoo import make_bundle

    bundle = make_bundle("t5", {"dropout": 0.0})
    train = TrainSpec.of(steps="first")
    sym = capture(bundle, train, CaptureConfig(target="cuda"))
    ops = {op for p in sym.paths for op in p.nodes["op"]}
    assert "_scaled_dot_product_efficient_attention_backward.default" in ops
    # the padded bias gradient (last dim rounded up to 16) is a non-contiguous view unless
    # S % 16 == 0: a size-dependent branch, kept as guards; where they fail, a graph traced
    # at the sizes themselves holds (as `predict` recaptures)
    held = []
    for sizes in ({"B": 2, "S": 32, "T": 16}, {"B": 2, "S": 7, "T": 5}, {"B": 3, "S": 33, "T": 17}):
        graph = sym
        if sym.violated_guards(sym.resolve_sizes(sizes)):
            graph = capture(bundle, train, CaptureConfig(target="cuda", sizes=sizes))
        held.append(graph is sym)
        assert not graph.violated_guards(graph.resolve_sizes(sizes))
        conc = capture(bundle, train, CaptureConfig(target="cuda", symbolic=False, sizes=sizes))
        assert _memory_equal(graph, conc, sizes), sizes
    assert held[0]


class _FixesTheBatch(torch.nn.Module):
    """A model that reads its batch as a Python int (as Bamba's mamba mixer does): the
    trace fixes B, and torch's shape environment keeps that as a replacement, not a
    guard."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        n = int(x.shape[0])
        return self.proj(x).sum() + torch.ones(n, 1024).sum()


def test_a_size_the_trace_fixed_becomes_a_guard():
    from memgnn.predictor.spec.bundle import ModelBundle

    bundle = ModelBundle(
        name="fixes-batch", family="test", build=_FixesTheBatch,
        make_inputs=lambda s, device, float_dtype=torch.float32: {
            "x": torch.randn(s["B"], s["S"], 8, device=device, dtype=float_dtype)
        },
        loss=lambda m, i: m(i["x"]), dims={"B": 3, "S": 10},
    )  # fmt: skip
    graph = capture(bundle, TrainSpec.of(optimizer="sgd"), CaptureConfig(target="cpu"))
    assert "(B == 3)" in graph.guards
    assert graph.violated_guards(graph.resolve_sizes({"B": 3, "S": 40})) == []
    assert graph.violated_guards(graph.resolve_sizes({"B": 5, "S": 10})) == ["(B == 3)"]
