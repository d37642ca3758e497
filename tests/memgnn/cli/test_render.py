"""What the CLI prints for people."""


def test_model_line_says_when_blocks_were_replicated():
    from memgnn.cli.render import model_line

    info = {"spec": "hf:x", "module_class": "LlamaForCausalLM", "layers": 32,
            "parameters": 10, "param_dtype": "bfloat16", "precision": "bf16"}  # fmt: skip
    assert "repeated blocks" not in model_line(info)
    how = {"mode": "blocks", "captured_blocks": 4, "blocks": 32}
    assert "repeated blocks (32 replicated from a 4-block capture)" in model_line(
        info | {"capture": how}
    )
    assert "repeated" not in model_line(info | {"capture": {"mode": "full", "why": "x"}})


def test_a_compiled_step_says_what_was_modelled_and_what_approximated():
    from memgnn.predictor.spec.train import TrainSpec

    from memgnn.cli.render import compile_lines

    assert compile_lines(TrainSpec.of()) == []
    (line,) = compile_lines(TrainSpec.of(compile="blocks"))
    assert "each repeated block" in line and "min-cut partitioner" in line
    assert "the buffers inductor's generated wrapper allocates" in line
    assert "inductor's CPU code generation stands in" in line
    assert "symbolic batch and sequence sizes, as torch.compile(dynamic=True)" in line
    (static,) = compile_lines(TrainSpec.of(compile="blocks", compile_dynamic=False))
    assert "lowered at the capture's sizes, as a static-shape compile" in static
    compiled, chunked = compile_lines(TrainSpec.of(compile="blocks", loss="chunked-ce:8"))
    assert "num_output_chunks=8" in chunked and "compiled per chunk" in chunked
    (eager,) = compile_lines(TrainSpec.of(loss="chunked-ce:4"))
    assert "num_output_chunks=4" in eager and "(eager)" in eager
