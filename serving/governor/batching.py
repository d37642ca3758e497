"""Batches for the governor: length buckets, token-budget batching, micro-batch splits.

A batch is a tensor, a dict/list/tuple of tensors (and other values), with the batch on
dim 0 of every tensor that has the batch size there. `split` cuts it into micro-batches
along that dim (views; nothing is copied), so re-running a batch in pieces feeds every
sample to the optimizer exactly once. `LengthBuckets` maps a sequence length to the upper
bound of its bucket (the padded length a batch of that bucket gets), and `TokenBatcher`
groups a stream of samples by bucket, yielding a bucket's batch when it holds as many
samples as the governor's plan for that bucket allows (per-length-bucket plans).
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger(__name__)

__all__ = [
    "BatchingConfig",
    "LengthBuckets",
    "TokenBatcher",
    "batch_size",
    "default_sizes",
    "even_chunks",
    "pad_collate",
    "sample_length",
    "split",
]

Collate = Callable[[list[Any], int], Any]


@dataclass(kw_only=True, slots=True)
class BatchingConfig:
    """Length buckets (explicit bounds, else multiples of `bucket_multiple` growing by
    `bucket_ratio` up to `max_length`) and the effective batch of `batches()`."""

    length_buckets: list[int] | None = None  # bucket upper bounds; None: geometric
    max_length: int = 4096
    bucket_ratio: float = 1.25
    bucket_multiple: int = 16
    keep_effective_batch: bool = False  # batches(): every step sees `effective_batch` samples
    effective_batch: int | None = None

    def __post_init__(self) -> None:
        if self.effective_batch is not None and self.effective_batch < 1:
            raise ValueError("effective_batch must be >= 1")
        if self.keep_effective_batch and self.effective_batch is None:
            raise ValueError("keep_effective_batch needs effective_batch")
        if self.length_buckets is not None and (
            not self.length_buckets or min(self.length_buckets) < 1
        ):
            raise ValueError("length_buckets must be positive lengths")
        if self.bucket_ratio <= 1 or self.bucket_multiple < 1 or self.max_length < 1:
            raise ValueError("need bucket_ratio > 1, bucket_multiple >= 1, max_length >= 1")


def batch_size(batch: Any) -> int:
    """Dim 0 of the first tensor in the batch."""
    for t in _leaves(batch):
        if isinstance(t, torch.Tensor) and t.dim() > 0:
            return int(t.shape[0])
    raise ValueError("the batch holds no tensor with a batch dimension")


def default_sizes(batch: Any) -> dict[str, int]:
    """{"B": samples, "S": padded length}: S from `input_ids`, else the first 2-D tensor."""
    n = batch_size(batch)
    seq = None
    if isinstance(batch, Mapping) and isinstance(batch.get("input_ids"), torch.Tensor):
        ids = batch["input_ids"]
        seq = int(ids.shape[1]) if ids.dim() > 1 else None
    if seq is None:
        for t in _leaves(batch):
            if isinstance(t, torch.Tensor) and t.dim() > 1 and t.shape[0] == n:
                seq = int(t.shape[1])
                break
    return {"B": n} if seq is None else {"B": n, "S": seq}


def split(batch: Any, chunks: list[int]) -> list[Any]:
    """The batch cut along dim 0 into consecutive pieces of the given sizes."""
    n = batch_size(batch)
    if sum(chunks) != n or min(chunks) < 1:
        raise ValueError(f"chunks {chunks} do not partition a batch of {n}")
    out, start = [], 0
    for c in chunks:
        out.append(_slice(batch, n, start, start + c))
        start += c
    return out


def even_chunks(n: int, micro: int) -> list[int]:
    """n samples in ceil(n / micro) pieces of nearly equal size, none above `micro`."""
    g = -(-n // micro)
    base, extra = divmod(n, g)
    return [base + 1] * extra + [base] * (g - extra)


def _slice(x: Any, n: int, a: int, b: int) -> Any:
    if isinstance(x, torch.Tensor):
        return x[a:b] if x.dim() > 0 and x.shape[0] == n else x
    if isinstance(x, Mapping):
        return type(x)({k: _slice(v, n, a, b) for k, v in x.items()})
    if isinstance(x, (list, tuple)) and not isinstance(x, str):
        items = [_slice(v, n, a, b) for v in x]
        return type(x)(items) if not hasattr(x, "_fields") else type(x)(*items)
    return x


def _leaves(x: Any) -> Iterator[Any]:
    if isinstance(x, Mapping):
        for v in x.values():
            yield from _leaves(v)
    elif isinstance(x, (list, tuple)) and not isinstance(x, str):
        for v in x:
            yield from _leaves(v)
    else:
        yield x


class LengthBuckets:
    """Bucket upper bounds: explicit, or multiples of `multiple` growing by `ratio`."""

    def __init__(
        self,
        bounds: list[int] | None = None,
        *,
        max_length: int = 4096,
        ratio: float = 1.25,
        multiple: int = 16,
    ) -> None:
        if bounds is None:
            if ratio <= 1 or multiple < 1 or max_length < 1:
                raise ValueError("need ratio > 1, multiple >= 1, max_length >= 1")
            bounds, b = [], multiple
            while b < max_length:
                bounds.append(b)
                b = max(b + multiple, -(-int(b * ratio) // multiple) * multiple)
            bounds.append(max_length)
        bounds = sorted(set(int(b) for b in bounds))
        if not bounds or bounds[0] < 1:
            raise ValueError(f"bad bucket bounds {bounds}")
        self.bounds = bounds

    @classmethod
    def from_config(cls, cfg: BatchingConfig) -> LengthBuckets:
        return cls(
            cfg.length_buckets,
            max_length=cfg.max_length,
            ratio=cfg.bucket_ratio,
            multiple=cfg.bucket_multiple,
        )

    def __call__(self, length: int) -> int:
        i = bisect.bisect_left(self.bounds, length)
        if i == len(self.bounds):
            raise ValueError(f"length {length} exceeds the largest bucket {self.bounds[-1]}")
        return self.bounds[i]


def sample_length(sample: Any) -> int:
    """Tokens in a sample: a 1-D tensor or a mapping with a 1-D `input_ids`."""
    ids = sample["input_ids"] if isinstance(sample, Mapping) else sample
    if isinstance(ids, torch.Tensor):
        return int(ids.shape[-1])
    return len(ids)


def pad_collate(samples: list[Any], length: int, pad_id: int = 0) -> dict[str, torch.Tensor]:
    """Right-pad 1-D token samples to `length`: {"input_ids", "lengths", other keys stacked}."""
    ids = torch.full((len(samples), length), pad_id, dtype=torch.long)
    lengths = torch.empty(len(samples), dtype=torch.long)
    extra: dict[str, list[Any]] = {}
    for i, s in enumerate(samples):
        tok = s["input_ids"] if isinstance(s, Mapping) else s
        tok = torch.as_tensor(tok, dtype=torch.long)
        ids[i, : tok.shape[0]] = tok
        lengths[i] = tok.shape[0]
        if isinstance(s, Mapping):
            for k, v in s.items():
                if k != "input_ids":
                    extra.setdefault(k, []).append(v)
    out = {"input_ids": ids, "lengths": lengths}
    for k, vals in extra.items():
        out[k] = torch.stack(vals) if isinstance(vals[0], torch.Tensor) else torch.tensor(vals)
    return out


class TokenBatcher:
    """Groups samples by length bucket; yields (bucket length, samples) when a bucket is
    full under `size_for(bucket)`, then every leftover at the end (no sample is dropped)."""

    def __init__(
        self,
        buckets: LengthBuckets,
        size_for: Callable[[int], int],
        length_of: Callable[[Any], int] = sample_length,
    ) -> None:
        self.buckets, self.size_for, self.length_of = buckets, size_for, length_of

    def __call__(self, samples: Iterable[Any]) -> Iterator[tuple[int, list[Any]]]:
        pending: dict[int, list[Any]] = {}
        for sample in samples:
            bucket = self.buckets(self.length_of(sample))
            group = pending.setdefault(bucket, [])
            group.append(sample)
            want = max(1, self.size_for(bucket))
            if len(group) >= want:
                yield bucket, group[:want]
                rest = group[want:]
                if rest:
                    pending[bucket] = rest
                else:
                    del pending[bucket]
        for bucket in sorted(pending, reverse=True):
            group = pending[bucket]
            while group:
                want = max(1, self.size_for(bucket))
                yield bucket, group[:want]
                group = group[want:]
