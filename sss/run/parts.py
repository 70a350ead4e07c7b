"""`build_parts`: the one build sequence every command shares (fit, validate/test, export).

Process state (once every process of a launched run met the others: `process_state`), then the
data module and its ``setup("fit")`` (which reads or makes the data, so that classes and
modalities are known), then the model settings that follow from the data, then the model,
seeded. Building in one place keeps ``sss export`` and ``sss validate`` building the very model
``sss fit`` trained.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sss.config import SSSConfig, instantiate
from sss.run.cluster import preflight_rendezvous
from sss.trainer.module import LitModule
from sss.trainer.trainer import use_cpu

__all__ = ["Parts", "build_parts", "process_state", "sizes_from_data"]


@dataclass
class Parts:
    """What `build_parts` built: the process state, the data module (set up) and the module."""

    state: Any
    """Accelerate's `PartialState` of this process (its rank, the process count)."""
    datamodule: Any
    module: LitModule
    from_data: dict[str, Any]
    """The model settings that came from the data (e.g. ``num_classes``), already merged into ``config.model``."""


def build_parts(cfg: SSSConfig) -> Parts:
    """Build the data module and the module of `cfg`; ``cfg.model`` gets the settings that come from the data.

    The model's initial weights are seeded with ``trainer.seed`` (they are part of the run).

    Example:
        >>> from sss.config import load_config
        >>> cfg = load_config(None, ["model._target_=sss.testing.BoringModule",
        ...                          "data._target_=sss.testing.BoringDataModule"])
        >>> parts = build_parts(cfg)
        >>> type(parts.module).__name__, parts.from_data
        ('BoringModule', {'num_classes': 2})
    """
    from accelerate.utils import set_seed

    state = process_state(cfg)
    datamodule = instantiate(cfg.data) if cfg.data else None  # a model folder's config may hold no data section
    if hasattr(datamodule, "setup"):
        datamodule.setup("fit")  # reads (or makes) the data: classes and modalities are known after it
    set_seed(cfg.trainer.seed)  # the model's initial weights are part of the run
    from_data = sizes_from_data(cfg.model, datamodule)
    cfg.model = {**cfg.model, **from_data}  # an exported config.yaml must rebuild this very model
    return Parts(state=state, datamodule=datamodule, module=instantiate(cfg.model), from_data=from_data)


def process_state(cfg: SSSConfig) -> Any:
    """This process's Accelerate `PartialState`, set up after the pre-flight rendezvous of a launched run.

    Every process of a run launched as several waits at most ``trainer.rendezvous_timeout`` seconds for all the
    others (`sss.run.cluster.preflight_rendezvous`); one that is missing ends the run with an error naming the
    ranks seen, before any data is read or model built, instead of hanging in the process group's set-up.

    Example:
        >>> from sss.config import SSSConfig
        >>> process_state(SSSConfig()).num_processes
        1
    """
    from accelerate import PartialState

    with preflight_rendezvous(cfg.trainer.rendezvous_timeout):
        return PartialState(cpu=use_cpu(cfg.trainer.cpu))


def sizes_from_data(spec: dict[str, Any], datamodule: Any) -> dict[str, Any]:
    """The model settings `spec` leaves out that the data decides: class count, and the modalities present.

    Example:
        >>> class Data:
        ...     classes, modalities = ["a", "b", "c"], ("audio",)
        >>> sizes_from_data({"_target_": "sss.models.create_model", "name": "hunter_tiny"}, Data())
        {'num_classes': 3, 'modalities': ['audio'], 'fusion': 'late'}
    """
    # examples/manifest.yaml leaves num_classes out: any folder works, and the head matches its
    # classes (ManifestDataModule knows them right after construction). For the registry's models,
    # data with one modality also decides which encoders exist (ESC-50 has no images).
    sizes: dict[str, Any] = {}
    classes = getattr(datamodule, "classes", None)
    if "num_classes" not in spec and classes:
        sizes["num_classes"] = len(classes)
    modalities = tuple(getattr(datamodule, "modalities", ()) or ())
    if spec.get("_target_") == "sss.models.create_model" and "modalities" not in spec and len(modalities) == 1:
        sizes["modalities"] = list(modalities)
        if "fusion" not in spec:
            sizes["fusion"] = "late"  # there is nothing to attend across
    return sizes
