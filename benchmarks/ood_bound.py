"""The learned bound far from the corpus: a model directory's answers on configs outside its
training range, against the exact replay, with the card's calibration as it is (network-
free fallback out of distribution) and as it was (the head's own forms only).

    python benchmarks/ood_bound.py --model-dir DIR [--cache runs/.bench-cache]

DIR is what `memgnn train --out OUT` wrote (OUT/model). Per config and metric: replay
bytes, the learned value and bound, each bound's margin over the replay, and the answer's
`breakdown["trust"]`. Writes benchmarks/results/ood_bound.{json,md}.
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from memgnn.predictor.answer.exact import ReplayModel  # noqa: E402
from memgnn.predictor.capture.cache import capture_cached
from memgnn.predictor.ir.vocab import METRICS  # noqa: E402
from memgnn.predictor.memory.base import Query  # noqa: E402
from memgnn.predictor.memory.onnx_model import OnnxMemoryModel  # noqa: E402
from memgnn.predictor.spec.train import TrainSpec  # noqa: E402
from memgnn.predictor.zoo import make_bundle  # noqa: E402

RESULTS = Path(__file__).parent / "results"
CASES = [  # (family, hparams, sizes): far below and far above the corpus
    ("mlp", {"hidden": 16, "layers": 1}, {"B": 1}),
    ("gpt2", {"layers": 2, "hidden": 768, "heads": 12}, {"B": 2048, "S": 1024}),
]
DEVICE = "h100-80gb"


def head_forms_only(card: dict) -> dict:
    """The card with its calibration restricted to the head's own forms (no fallback)."""
    out = copy.deepcopy(card)
    for key, c in (card.get("bound_calibration") or {}).items():
        forms = [f for f in c["candidates"] if f in ("shift", "scaled", "plain")]
        best = min(forms, key=lambda f: c["candidates"][f]["median_margin"])
        out["bound_calibration"][key] = {"form": best, "q": c["candidates"][best]["q"],
                                         "target_miss": c["target_miss"]}  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-dir", required=True)
    p.add_argument("--cache", default="runs/.bench-cache")
    a = p.parse_args(argv)
    src = Path(a.model_dir)
    with tempfile.TemporaryDirectory() as tmp:
        old_dir = Path(tmp) / "model"
        shutil.copytree(src, old_dir)
        card = json.loads((src / "model_card.json").read_text())
        (old_dir / "model_card.json").write_text(json.dumps(head_forms_only(card)))
        new, old = OnnxMemoryModel.load(src), OnnxMemoryModel.load(old_dir)
        rows = []
        for family, hp, sizes in CASES:
            graph = capture_cached(make_bundle(family, hp), TrainSpec(), directory=Path(a.cache))
            for metric in METRICS:
                q = [Query(sizes=sizes, device=DEVICE, metric=metric)]
                exact = ReplayModel().predict(graph, q)[0].predicted_peak_bytes
                n, o = new.predict(graph, q)[0], old.predict(graph, q)[0]
                nb, ob = n.upper_bound_bytes, o.upper_bound_bytes
                rows.append({"family": family, "hparams": hp, "sizes": sizes, "metric": metric,
                             "replay": exact, "value": n.predicted_peak_bytes, "bound": nb,
                             "margin": nb / exact - 1, "head_value": o.predicted_peak_bytes,
                             "head_bound": ob, "head_margin": ob / exact - 1,
                             "trust": n.breakdown["trust"]})  # fmt: skip
    cmd = "python benchmarks/ood_bound.py " + " ".join(argv or sys.argv[1:])
    res = {"model_version": card["model_version"], "device": DEVICE, "command": cmd, "rows": rows}
    lines = ["# The learned bound out of distribution, against the replay", "",
             f"Model `{res['model_version']}` on {DEVICE}. Command: `{cmd}`", "",
             "| config | sizes | metric | replay B | value B | bound B (margin) | head-forms "
             "bound B (margin) | in distribution | bound |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        lines.append(f"| {r['family']} {r['hparams']} | {r['sizes']} | {r['metric']} | "
                     f"{r['replay']:,} | {r['value']:,} | {r['bound']:,} ({r['margin']:+.1%}) | "
                     f"{r['head_bound']:,} ({r['head_margin']:+.1%}) | "
                     f"{r['trust']['in_distribution']} | {r['trust']['bound']} |")  # fmt: skip
    lines += ["", "Reasons given (first config, reserved): "
              + "; ".join(rows[1]["trust"]["reasons"])]  # fmt: skip
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "ood_bound.json").write_text(json.dumps(res, indent=2))
    (RESULTS / "ood_bound.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
