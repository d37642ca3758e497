"""`predict_step` / `predict_trainer`: the user's own step answered through
`answer.predict` (the same Answer as `memgnn predict`): on cpu the real CPU step's bytes,
on a GPU the allocator replay; each answer says what it assumed."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from memgnn.predictor.answer.types import PredictAnswer
from memgnn.predictor.answer.user_step import predict_step, predict_trainer
from memgnn.predictor.errors import UserError
from torch import nn

SIZES = {"B": 16}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(32, 64), nn.Linear(64, 10)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def step_fn(model, optimizer, batch):
    x, y = batch
    loss = F.cross_entropy(model(x), y) + 1e-4 * sum(p.pow(2).sum() for p in model.parameters())
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss.item()


def make_batch(B):  # noqa: N803 - the size's name
    return torch.randn(B, 32), torch.randint(0, 10, (B,))


def adamw(params):
    return torch.optim.AdamW(params)


def test_on_cpu_the_answer_is_the_real_cpu_steps_bytes():
    from memgnn.dataset.cpu_backend import profile_cpu
    from memgnn.predictor.capture.user_step import UserStep, user_bundle
    from memgnn.predictor.spec.train import TrainSpec

    got = predict_step(Net, step_fn, make_batch, optimizer=adamw, sizes=SIZES, device="cpu")
    assert isinstance(got, PredictAnswer)
    (a,) = got.predictions
    real = profile_cpu(user_bundle(Net, SIZES), TrainSpec(), SIZES, make_step=lambda t: UserStep(
        Net, step_fn, make_batch, adamw, device=torch.device("cpu"), target=t))  # fmt: skip
    assert a.predicted_peak_bytes == a.upper_bound_bytes == real["peak_allocated_bytes"]
    assert a.metric == "allocated" and a.device == "cpu" and a.sizes == SIZES
    assert a.breakdown["categories"] == real["breakdown"]["categories"]
    assert a.train["step"] == "user" and a.train["step_fn"].endswith(".step_fn")
    assert a.train["optimizer"] == "torch.optim.adamw.AdamW"
    assert a.model["module_class"] == "Net" and a.model["kind"] == "py"
    notes = a.breakdown["assumptions"]
    assert any("concrete sizes B=16" in n for n in notes)
    assert any("loss.item()" in n for n in notes)
    assert a.warnings == []  # no "size B never reaches" for a concrete capture


@pytest.mark.slow
def test_on_a_gpu_the_allocator_replay_answers_with_its_bound_and_breakdown():
    got = predict_step(Net, step_fn, make_batch, optimizer=adamw, sizes=SIZES,
                       device="a100-80gb", budget="1GiB")  # fmt: skip
    (a,) = got.predictions
    assert a.method == "replay" and a.metric == "reserved"
    assert a.upper_bound_bytes >= a.predicted_peak_bytes >= a.breakdown["tensor_peak_bytes"]
    assert a.predicted_peak_bytes % (2 << 20) == 0  # whole 2 MiB segments
    params = (32 * 64 + 64 + 64 * 10 + 10) * 4
    assert a.breakdown["categories"]["parameter"] == params  # by hand
    assert a.verdict is not None and a.verdict["fits"]


def test_bad_requests_are_user_errors():
    with pytest.raises(UserError, match="sizes"):
        predict_step(Net, step_fn, make_batch, optimizer=adamw, sizes={}, device="cpu")
    with pytest.raises(UserError) as err:
        predict_step(Net, step_fn, make_batch, optimizer=adamw, sizes=SIZES, device="no-such")
    assert err.value.loc == ("device",)


@pytest.mark.slow
def test_a_trainer_is_answered_with_the_trainers_assumptions(tmp_path):
    transformers = pytest.importorskip("transformers")
    from memgnn.predictor.capture.hf_trainer import no_weights
    from tiny_models import tiny_llama_config

    args = transformers.TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True,
                                          per_device_train_batch_size=2)  # fmt: skip
    with no_weights():
        model = transformers.AutoModelForCausalLM.from_config(tiny_llama_config())
        trainer = transformers.Trainer(model=model, args=args)
    (a,) = predict_trainer(trainer, sizes={"B": 2, "S": 16}, device="cpu").predictions
    assert a.predicted_peak_bytes > a.breakdown["categories"]["parameter"] > 0
    assert a.train["trainer"]["optim"] == "adamw_torch_fused"
    assert any("training_step" in n for n in a.breakdown["assumptions"])
    assert a.model["module_class"] == "LlamaForCausalLM"


@pytest.mark.slow
def test_a_trainer_on_a_gpu_keeps_fused_adamws_state_on_the_device_by_hand(tmp_path):
    transformers = pytest.importorskip("transformers")
    from memgnn.predictor.capture.hf_trainer import no_weights
    from tiny_models import tiny_llama_config

    args = transformers.TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True,
                                          per_device_train_batch_size=2)  # fmt: skip
    with no_weights():
        model = transformers.AutoModelForCausalLM.from_config(tiny_llama_config())
        trainer = transformers.Trainer(model=model, args=args)
    (a,) = predict_trainer(trainer, sizes={"B": 2, "S": 16}, device="a100-80gb").predictions
    assert a.method == "replay" and a.metric == "reserved"
    params = list(model.parameters())
    weights = sum(p.numel() * p.element_size() for p in params)
    # adamw_torch_fused: two moments of each weight and a float32 `step` per parameter
    # tensor, all on the device (a non-fused AdamW keeps the steps on the host)
    assert a.breakdown["categories"]["optimizer_state"] == 2 * weights + 4 * len(params)
