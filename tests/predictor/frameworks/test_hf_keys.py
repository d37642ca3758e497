"""The TrainingArguments / TRL key tables (predictor/frameworks/hf_keys.py)."""

from __future__ import annotations

import dataclasses

import pytest
from memgnn.predictor.frameworks.hf_keys import FEATURES, HF_ONLY, NO_EFFECT, OLDER_ONLY, TRL_ONLY


def test_the_tables_do_not_overlap():
    tables = [set(NO_EFFECT), set(FEATURES), set(HF_ONLY)]
    for i, a in enumerate(tables):
        for b in tables[i + 1 :]:
            assert a & b == set()


def test_every_field_of_the_installed_trainingarguments_is_in_a_table():
    transformers = pytest.importorskip("transformers")
    fields = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
    known = set(NO_EFFECT) | set(FEATURES) | HF_ONLY | TRL_ONLY
    assert sorted(fields - known) == []


# TrainingArguments fields of transformers 4.36.2 / 4.46.3 / 4.57.3 that 5.x dropped (read off
# the wheels' training_args.py): files exported by those releases carry them
OLDER_FIELDS = (
    "_n_gpu", "adafactor", "dispatch_batches", "evaluation_strategy", "fp16_backend",
    "fp16_opt_level", "fsdp_min_num_params", "fsdp_transformer_layer_cls_to_wrap",
    "group_by_length", "half_precision_backend", "include_inputs_for_metrics",
    "include_tokens_per_second", "jit_mode_eval", "logging_dir", "mp_parameters", "no_cuda",
    "overwrite_output_dir", "past_index", "per_gpu_eval_batch_size", "per_gpu_train_batch_size",
    "push_to_hub_model_id", "push_to_hub_organization", "push_to_hub_token", "ray_scope",
    "save_safetensors", "split_batches", "torchdynamo", "tpu_metrics_debug", "tpu_num_cores",
    "use_ipex", "use_legacy_prediction_loop", "use_mps_device", "warmup_ratio",
)  # fmt: skip


def test_the_fields_older_releases_export_are_in_a_table():
    known = set(NO_EFFECT) | set(FEATURES) | HF_ONLY | TRL_ONLY
    assert [f for f in OLDER_FIELDS if f not in known] == []
    assert set(OLDER_FIELDS) == OLDER_ONLY
