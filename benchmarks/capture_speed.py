"""Capture speed side by side with its peers, and GNN query/encode speed by graph size.

1. Capture (Llama-style, hidden 256, AdamW fp32, two steps, at 2/8/32 layers, plus a 7B
   Llama config in bf16): in the same process, alternating, each repeated and the
   median taken,
   - `bare`: the two training steps under a plain (concrete) FakeTensorMode;
   - `tracker`: the same with a minimal storage tracker (a dispatch mode that counts
     each new storage once and frees it through a weakref finalizer: peak allocated
     bytes on the CPU, no rounding);
   - `bare_symbolic`: the bare run under a ShapeEnv with B and S symbolic, as capture
     runs it (what torch's symbolic shapes cost before memgnn records anything);
   - `memgnn`: `predictor.capture.capture.capture` (symbolic, both steps, every path);
   - `mem_tracker`: PyTorch's `torch.distributed._tools.mem_tracker.MemTracker` under
     FakeTensorMode, the same two steps at the trace sizes.
   Wall seconds and this process's CPU seconds (the machine is shared: wall time
   includes waiting for a core); the load average is recorded with each case.
   `peak` columns are allocated bytes at the trace sizes on the CPU: the tracker's, and
   memgnn's analytic sweep of its graph (they must agree).
2. GNN query and encode (`load_default_model()`), in-process, on the graphs captured in
   part 1 (2 layers: ~1.1k nodes; 32 layers: ~15k nodes; `--query-only`: 43 layers too,
   ~20k nodes, captured into `--graphs` where missing), median of repeats: the one-query
   path beside the batch path it replaced, and MemTracker at a new size on small graphs.

    .venv/bin/python benchmarks/capture_speed.py [--layers 2,8,32] [--repeats 3] [--no-7b]
    .venv/bin/python benchmarks/capture_speed.py --query-only --graphs DIR --repeats 5
    # writes benchmarks/results/capture_speed.{json,md}
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import weakref
from pathlib import Path

import torch
from memgnn.predictor.capture.capture import capture
from memgnn.predictor.capture.step import TrainingStep
from memgnn.predictor.memory.analytic import sweep
from memgnn.predictor.spec.train import TrainSpec
from memgnn.predictor.zoo import make_bundle
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

OUT = Path(__file__).parent / "results"
PROFILE = OUT / "capture_speed_profile.json"
SMALL = {"hidden": 256, "heads": 4, "kv_heads": 2, "ffn": 688, "vocab": 4096}
LLAMA_7B = {"layers": 32, "hidden": 4096, "heads": 32, "kv_heads": 32, "ffn": 11008,
            "vocab": 32000, "max_positions": 2048}  # fmt: skip
FP32 = TrainSpec.of(optimizer="adamw")
BF16 = TrainSpec.of(precision="bf16", optimizer="adamw")


class StorageTracker(TorchDispatchMode):
    """The minimal peer: each new output storage counted once, freed by a finalizer."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[int] = set()
        self.live = self.peak = 0

    def _free(self, key: int, nbytes: int) -> None:
        self.seen.discard(key)
        self.live -= nbytes

    def add(self, t: torch.Tensor) -> None:
        if t.layout != torch.strided:
            return
        st = t.untyped_storage()
        key = id(st)
        if key in self.seen:
            return
        self.seen.add(key)
        n = st.nbytes()
        self.live += n
        self.peak = max(self.peak, self.live)
        weakref.finalize(st, self._free, key, n)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.add(t)
        return out


def _step(bundle, train: TrainSpec) -> TrainingStep:
    return TrainingStep(bundle, train, device=torch.device("cpu"), target="cuda", fake=True)


def run_bare(bundle, train: TrainSpec, *, symbolic: bool = False, track: bool = False):
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

    env = ShapeEnv(duck_shape=False) if symbolic else None
    with FakeTensorMode(shape_env=env, allow_non_fake_inputs=True):
        step = _step(bundle, train)
        sizes: dict = dict(bundle.sizes())
        if env is not None:
            for name, hint in list(sizes.items()):
                sym = env.create_symbol(hint, ConstantSource(name), dynamic_dim=DimDynamic.DYNAMIC)
                sizes[name] = env.create_symintnode(sym, hint=hint)
        tracker = StorageTracker()
        if track:
            for t in [*step.model.parameters(), *step.model.buffers()]:
                tracker.add(t)
            with tracker:
                step.run(sizes, steps=(0, 1))
        else:
            step.run(sizes, steps=(0, 1))
        return tracker.peak if track else None


def run_mem_tracker(bundle, train: TrainSpec) -> int:
    from torch.distributed._tools.mem_tracker import MemTracker

    with FakeTensorMode(allow_non_fake_inputs=True):
        step = _step(bundle, train)
        mt = MemTracker()
        mt.track_external(step.model, step.optimizer)
        with mt:  # it tracks one iteration at a time: module stats reset between steps
            step.run(bundle.sizes(), steps=(0,))
            mt.reset_mod_stats()
            step.run(bundle.sizes(), steps=(1,))
        snap = mt.get_tracker_snapshot("peak")
        return int(max(d.get("Total", 0) for d in snap.values()))


def timed(fn, repeats: int) -> tuple[dict, object]:
    walls, cpus, out = [], [], None
    for _ in range(repeats):
        w, c = time.perf_counter(), time.process_time()
        out = fn()
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    return {"wall_s": round(statistics.median(walls), 6),
            "cpu_s": round(statistics.median(cpus), 6), "runs": len(walls)}, out  # fmt: skip


def capture_case(name: str, bundle, train: TrainSpec, repeats: int, peers: bool) -> dict:
    load = os.getloadavg()[0]
    row: dict = {"case": name, "load_before": round(load, 2)}
    row["bare"], _ = timed(lambda: run_bare(bundle, train), repeats)
    row["tracker"], row["tracker_peak"] = timed(
        lambda: run_bare(bundle, train, track=True), repeats
    )
    row["bare_symbolic"], _ = timed(lambda: run_bare(bundle, train, symbolic=True), repeats)
    row["memgnn"], graph = timed(lambda: capture(bundle, train), repeats)
    row["memgnn_peak"] = int(sweep(graph, bundle.sizes()).peak_bytes)
    row["nodes"] = graph.paths[0].num_nodes
    if peers:
        row["mem_tracker"], row["mem_tracker_peak"] = timed(
            lambda: run_mem_tracker(bundle, train), repeats
        )
    row["load_after"] = round(os.getloadavg()[0], 2)
    for key in ("tracker", "bare_symbolic", "memgnn", "mem_tracker"):
        if key in row:
            row[f"{key}_over_bare"] = round(row[key]["cpu_s"] / row["bare"]["cpu_s"], 2)
    print(json.dumps(row), file=sys.stderr, flush=True)
    return row, graph


def query_speed(graphs: dict, repeats: int, mem_tracker_nodes: int = 0) -> list[dict]:
    """Per graph: encode (graph features + encoder), the per-path context, a full query
    through the one-query path and, in the same process, through the batch path it
    replaced (`onnx_model.FEW_QUERIES = 0`: `PathContext.query_many`), whose answers must
    be the same; MemTracker under FakeTensorMode at one new size for graphs of up to
    `mem_tracker_nodes` nodes (its cost per size is what a query replaces)."""
    import memgnn.predictor.memory.onnx_model as om
    from memgnn.predictor.memory.base import Query
    from memgnn.predictor.memory.features import graph_inputs
    from memgnn.predictor.memory.onnx_model import OnnxMemoryModel, load_default_model
    from memgnn.predictor.spec.devices import get_profile

    model = load_default_model()
    if not isinstance(model, OnnxMemoryModel):
        return []
    rows = []
    q = [Query(sizes={"B": 8, "S": 512}, device="a100-80gb")]
    device = get_profile("a100-80gb")
    for name, graph in graphs.items():
        model.graph_id(graph)  # the id is known once a graph is loaded or captured

        def encode(graph=graph):  # as for a graph just loaded: no path arrays cached yet
            model._embeddings.clear()
            for p in graph.paths:
                p._cache = None
            model.encode(graph)

        def context(graph=graph):
            model._contexts.clear()
            model._path_contexts(graph)

        enc, _ = timed(encode, max(repeats, 5))

        def features(graph=graph):
            for p in graph.paths:
                p._cache = None
            return graph_inputs(graph, 0)

        feats, gi = timed(features, max(repeats, 5))
        feed = dict(zip(("x", "in_src", "in_ptr", "out_dst", "out_ptr"), (gi.x, *gi.csr())))
        net, _ = timed(lambda feed=feed: model._encoder.run(None, feed), max(repeats, 5))
        ctx, _ = timed(context, max(repeats, 5))
        fast = model.predict(graph, q)
        ctx0 = model._path_contexts(graph)[0]
        one, _ = timed(lambda c=ctx0: c.query({"B": 8, "S": 512}, device), 1000)
        qry, _ = timed(lambda graph=graph: model.predict(graph, q), 1000)
        om.FEW_QUERIES, few = 0, om.FEW_QUERIES
        try:
            batch = model.predict(graph, q)
            old, _ = timed(lambda graph=graph: model.predict(graph, q), 200)
        finally:
            om.FEW_QUERIES = few
        row = {"graph": name, "nodes": graph.paths[0].num_nodes,
               "encode_ms": round(enc["wall_s"] * 1e3, 2),
               "encode_cpu_ms": round(enc["cpu_s"] * 1e3, 2),
               "graph_inputs_cpu_ms": round(feats["cpu_s"] * 1e3, 2),
               "encoder_cpu_ms": round(net["cpu_s"] * 1e3, 2),
               "context_ms": round(ctx["wall_s"] * 1e3, 2),
               "features_ms": round(one["wall_s"] * 1e3, 4),
               "features_cpu_ms": round(one["cpu_s"] * 1e3, 4),
               "query_ms": round(qry["wall_s"] * 1e3, 4),
               "query_cpu_ms": round(qry["cpu_s"] * 1e3, 4),
               "batch_path_query_ms": round(old["wall_s"] * 1e3, 4),
               "batch_path_query_cpu_ms": round(old["cpu_s"] * 1e3, 4),
               "same_answer": [p.to_dict() for p in fast] == [p.to_dict() for p in batch],
               "load": round(os.getloadavg()[0], 2)}  # fmt: skip
        layers = int(name.split()[1])
        if row["nodes"] <= mem_tracker_nodes:
            bundle = make_bundle("llama", {**SMALL, "layers": layers})
            mt, _ = timed(lambda bundle=bundle: run_mem_tracker(bundle, FP32), 1)
            row["mem_tracker_s"], row["mem_tracker_cpu_s"] = mt["wall_s"], mt["cpu_s"]
        print(json.dumps(row), file=sys.stderr, flush=True)
        rows.append(row)
    return rows


# where self time goes, by the file a function is defined in
PROFILE_GROUPS = (
    ("sympy (expression building and simplification)", "/sympy/"),
    ("torch symbolic shapes (sym_node, symbolic_shapes, recording)", "/fx/experimental/"),
    ("fake tensor dispatch (fake_tensor, fake_impls, meta kernels, refs, prims)",
     ("/_subclasses/", "/_meta_registrations", "/_refs/", "/_prims", "/_decomp/")),
    ("memgnn (recorder, hooks, expressions)", ("/predictor/", "/dataset/")),
    ("autograd, optimizer, modules and the rest", ""),
)  # fmt: skip


def profile_shares(fn) -> list[dict]:
    """Share of CPU self time per PROFILE_GROUPS entry over one call of fn (cProfile)."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    totals = dict.fromkeys((g for g, _ in PROFILE_GROUPS), 0.0)
    for (path, _, _), (_, _, self_s, _, _) in pstats.Stats(prof).stats.items():
        for group, keys in PROFILE_GROUPS:
            if any(k in path for k in ((keys,) if isinstance(keys, str) else keys)):
                totals[group] += self_s
                break
    whole = sum(totals.values()) or 1.0
    return [{"group": g, "self_s": round(v, 2), "share": round(v / whole, 3)}
            for g, v in totals.items()]  # fmt: skip


def markdown(result: dict) -> str:
    lines = ["# Capture speed, side by side (and GNN query/encode)", "",
             f"Command: `{result['command']}`; torch {result['torch']}; "
             f"{os.cpu_count()} cores shared with other jobs (load average per row).",
             "Seconds are medians of the repeats: CPU seconds of this process (wall in "
             "brackets). Ratios are CPU seconds over the bare fake run's.", "",
             "| case | nodes | load | bare | tracker | symbolic bare | memgnn | MemTracker | "
             "memgnn/bare | tracker peak | memgnn peak | MemTracker peak |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip

    def cell(r, k):
        return f"{r[k]['cpu_s']} ({r[k]['wall_s']})" if k in r else "-"

    for r in result["capture"]:
        lines.append(
            f"| {r['case']} (x{r['bare']['runs']}) | {r['nodes']} | "
            f"{r['load_before']}-{r['load_after']} | "
            f"{cell(r, 'bare')} | {cell(r, 'tracker')} | {cell(r, 'bare_symbolic')} | "
            f"{cell(r, 'memgnn')} | {cell(r, 'mem_tracker')} | {r['memgnn_over_bare']} | "
            f"{r['tracker_peak']} | {r['memgnn_peak']} | {r.get('mem_tracker_peak', '-')} |"
        )
    lines += ["", "## GNN query and encode (in-process, onnxruntime, 1 thread)", "",
              f"Command: `{result.get('query_command', result['command'])}`. Medians "
              "(1000 queries, 200 on the batch path, 5 encodes); CPU ms of this process, "
              "wall ms in brackets (the machine is shared: CPU time is the fair figure). "
              "encode = `OnnxMemoryModel.encode` (graph features + encoder, graph id known) "
              "of a graph just loaded (no path arrays converted yet), split into "
              "`graph_inputs` (CPU ms) and the encoder run (CPU ms); context = the per-path "
              "query arrays, built at the first query; features = `PathContext.query` (the "
              "one-query path); full query = `predict` of one config (B=8, S=512, "
              "a100-80gb) after both; batch path = the same `predict` through "
              "`query_many`, the path a query took before (same process, same answer: "
              "`same`); MemTracker = PyTorch's MemTracker under FakeTensorMode, two steps "
              "at one new size (what memgnn's query replaces).", "",
              "| graph | nodes | encode ms | graph_inputs | encoder | context ms | "
              "features ms | full query ms | batch path ms | same | MemTracker s | load |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip

    def ms(r, k):
        return f"{r[k + '_cpu_ms']} ({r[k + '_ms']})" if k + "_cpu_ms" in r else "-"

    for r in result["query"]:
        mt = (f"{r['mem_tracker_cpu_s']} ({r['mem_tracker_s']})" if "mem_tracker_s" in r
              else "-")  # fmt: skip
        lines.append(f"| {r['graph']} | {r['nodes']} | {ms(r, 'encode')} | "
                     f"{r.get('graph_inputs_cpu_ms', '-')} | {r.get('encoder_cpu_ms', '-')} | "
                     f"{r['context_ms']} | {ms(r, 'features')} | {ms(r, 'query')} | "
                     f"{ms(r, 'batch_path_query')} | {r.get('same_answer', '-')} | {mt} | "
                     f"{r['load']} |")  # fmt: skip
    if PROFILE.is_file():
        prof = json.loads(PROFILE.read_text())
        lines += ["", f"## Where the time goes ({prof['case']}, cProfile self time)", "",
                  f"Command: `{prof['command']}`. cProfile's clock is wall time, inflated "
                  "by the profiler and the machine's load: the shares are the point.", "",
                  "| | " + " | ".join(prof["runs"]) + " |",
                  "|---|" + "---|" * len(prof["runs"])]  # fmt: skip
        for k, (group, _) in enumerate(PROFILE_GROUPS):
            cells = [f"{rows[k]['self_s']} s ({rows[k]['share']:.0%})"
                     for rows in prof["runs"].values()]  # fmt: skip
            lines.append(f"| {group} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def profile_only(args) -> None:
    n = int(args.profile)
    bundle = make_bundle("llama", {**SMALL, "layers": n})
    warm = make_bundle("llama", {**SMALL, "layers": 1})
    capture(warm, FP32)
    runs = {"bare (concrete fake)": profile_shares(lambda: run_bare(bundle, FP32)),
            "bare, symbolic B and S": profile_shares(
                lambda: run_bare(bundle, FP32, symbolic=True)),
            "memgnn capture": profile_shares(lambda: capture(bundle, FP32))}  # fmt: skip
    prof = {
        "case": f"llama {n} layers",
        "runs": runs,
        "command": "python benchmarks/capture_speed.py " + " ".join(sys.argv[1:]),
    }
    PROFILE.write_text(json.dumps(prof, indent=2) + "\n")
    print(json.dumps(prof, indent=2))


def query_only(args) -> None:
    from memgnn.predictor.ir.graph import StepGraph

    graphs = {}
    for n in sorted(int(x) for x in args.query_layers.split(",") if x):
        path = args.graphs / f"llama{n}.json.gz"
        if not path.is_file():  # captured once (as part 1 captures it) and kept
            args.graphs.mkdir(parents=True, exist_ok=True)
            capture(make_bundle("llama", {**SMALL, "layers": n}), FP32).save(path)
        graphs[f"llama {n} layers"] = StepGraph.load(path)
    path = OUT / "capture_speed.json"
    result = json.loads(path.read_text())
    result["query"] = query_speed(graphs, args.repeats, args.mem_tracker_nodes)
    result["query_command"] = "python benchmarks/capture_speed.py " + " ".join(sys.argv[1:])
    path.write_text(json.dumps(result, indent=2) + "\n")
    (OUT / "capture_speed.md").write_text(markdown(result))
    print(markdown(result))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", default="2,8,32")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-7b", action="store_true")
    ap.add_argument("--no-mem-tracker", action="store_true")
    ap.add_argument("--graphs", type=Path, help="keep the captured graphs in this folder")
    ap.add_argument("--query-only", action="store_true",
                    help="part 2 only, on the graphs a run with --graphs kept")  # fmt: skip
    ap.add_argument("--profile", help="only: cProfile shares at this many layers")
    ap.add_argument("--query-layers", default="2,8,32,43",
                    help="--query-only: graphs in --graphs (captured where missing)")  # fmt: skip
    ap.add_argument("--mem-tracker-nodes", type=int, default=5000,
                    help="query part: MemTracker at a new size up to this many nodes")  # fmt: skip
    ap.add_argument("--out-name", default="capture_speed", help="results file name stem")
    args = ap.parse_args()
    if args.profile:
        return profile_only(args)
    if args.query_only:
        return query_only(args)
    warm = make_bundle("llama", {**SMALL, "layers": 1})
    run_bare(warm, FP32, track=True)  # imports and first-call costs out of the timings
    run_bare(warm, FP32, symbolic=True)
    capture(warm, FP32)
    rows, graphs = [], {}
    for n in (int(x) for x in args.layers.split(",") if x):
        bundle = make_bundle("llama", {**SMALL, "layers": n})
        row, graph = capture_case(f"llama {n} layers", bundle, FP32, args.repeats,
                                  not args.no_mem_tracker)  # fmt: skip
        rows.append(row)
        graphs[f"llama {n} layers"] = graph
        if args.graphs is not None:
            args.graphs.mkdir(parents=True, exist_ok=True)
            graph.save(args.graphs / f"llama{n}.json.gz")
    if not args.no_7b:
        row, _ = capture_case("llama 7B bf16", make_bundle("llama", LLAMA_7B), BF16,
                              args.repeats, not args.no_mem_tracker)  # fmt: skip
        rows.append(row)
    result = {
        "command": "python benchmarks/capture_speed.py " + " ".join(sys.argv[1:]),
        "torch": torch.__version__,
        "capture": rows,
        "query": query_speed(graphs, args.repeats, args.mem_tracker_nodes),
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{args.out_name}.json").write_text(json.dumps(result, indent=2) + "\n")
    (OUT / f"{args.out_name}.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
