"""mlflow tracking for `memgnn train` (mlflow is imported lazily: importing it takes seconds).

Default store: `sqlite:///<out>/mlflow.db` with artifacts under `<out>/mlartifacts`, so no
server is needed; any tracking URI works (`--tracking-uri`). A run logs the parameters,
per-epoch metrics, the final metrics, the parity plot and the model card, and logs the
ONNX model directory as an mlflow pyfunc model registered under `--registered-model` with
the alias `--alias`. A resumed training run continues the same mlflow run.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def default_tracking_uri(out: Path) -> str:
    return f"sqlite:///{out.resolve() / 'mlflow.db'}"


class Tracker:
    """A thin, optional wrapper over one mlflow run (`enabled=False`: does nothing)."""

    def __init__(self, *, out: Path, uri: str | None, experiment: str, enabled: bool = True):
        self.out, self.enabled = out, enabled
        self.uri = uri or default_tracking_uri(out)
        self.experiment = experiment
        self.run_id: str | None = None
        self._mlflow = None

    def _m(self):
        if self._mlflow is None:
            import mlflow

            mlflow.set_tracking_uri(self.uri)
            self._mlflow = mlflow
        return self._mlflow

    def start(self, params: dict[str, Any], run_id: str | None = None) -> str | None:
        if not self.enabled:
            return None
        mlflow = self._m()
        exp = mlflow.get_experiment_by_name(self.experiment)
        if exp is None:
            local = self.uri.startswith(("sqlite:", "file:")) or "://" not in self.uri
            location = (self.out.resolve() / "mlartifacts").as_uri() if local else None
            exp_id = mlflow.create_experiment(self.experiment, artifact_location=location)
        else:
            exp_id = exp.experiment_id
        if run_id is not None:
            run = mlflow.start_run(run_id=run_id)
            log.info("mlflow: resumed run %s", run_id)
        else:
            run = mlflow.start_run(experiment_id=exp_id, run_name=self.out.name)
            mlflow.log_params({k: str(v)[:500] for k, v in params.items()})
        self.run_id = run.info.run_id
        return self.run_id

    def log_epoch(self, epoch: int, row: dict[str, float]) -> None:
        if self.enabled:
            self._m().log_metrics({k: float(v) for k, v in row.items() if k != "epoch"}, step=epoch)

    def log_metrics(self, metrics: dict[str, float]) -> None:
        if self.enabled:
            self._m().log_metrics(metrics)

    def log_artifact(self, path: Path) -> None:
        if self.enabled and path.exists():
            self._m().log_artifact(str(path))

    def register(self, model_dir: Path, name: str, alias: str) -> dict[str, Any]:
        """Log the ONNX directory as a pyfunc model, register it, point `alias` at it."""
        if not self.enabled:
            return {}
        from memgnn.training.pyfunc import MemgnnPyfunc

        mlflow = self._m()
        with warnings.catch_warnings():  # "add type hints to predict": input is a dict
            warnings.simplefilter("ignore", UserWarning)
            info = mlflow.pyfunc.log_model(
                name="model",
                python_model=MemgnnPyfunc(),
                artifacts={"model_dir": str(model_dir)},
                pip_requirements=["onnxruntime", "numpy"],
                registered_model_name=name,
            )
        version = str(info.registered_model_version)
        mlflow.MlflowClient().set_registered_model_alias(name, alias, version)
        log.info("mlflow: registered %s version %s as @%s", name, version, alias)
        return {"registered_model": name, "version": version, "alias": alias,
                "model_uri": f"models:/{name}@{alias}", "tracking_uri": self.uri,
                "run_id": self.run_id}  # fmt: skip

    def end(self) -> None:
        if self.enabled and self._mlflow is not None and self._mlflow.active_run():
            self._mlflow.end_run()


def parity_plot(path: Path, series: dict[str, tuple[Any, Any]], title: str) -> Path | None:
    """Predicted vs measured (log-log), one colour per series; None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.info("matplotlib is not installed: no parity plot")
        return None
    fig, ax = plt.subplots(figsize=(5.5, 5))
    lo, hi = float("inf"), 0.0
    for label, (measured, predicted) in series.items():
        if len(measured) == 0:
            continue
        ax.scatter(measured, predicted, s=6, alpha=0.6, label=label)
        lo = min(lo, float(min(measured)), float(min(predicted)))
        hi = max(hi, float(max(measured)), float(max(predicted)))
    if hi > 0:
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
    ax.set(xscale="log", yscale="log", xlabel="measured bytes", ylabel="predicted bytes")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
