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

from sss.config import ConfigError, SSSConfig, instantiate
from sss.config.instantiate import split_model_spec
from sss.run.cluster import preflight_rendezvous
from sss.trainer.module import LitModule
from sss.trainer.trainer import use_cpu

__all__ = ["Parts", "build_parts", "check_num_classes", "process_state", "sizes_from_data"]


@dataclass
class Parts:
    """What `build_parts` built: the process state, the data module (set up) and the module."""

    state: Any
    """Accelerate's `PartialState` of this process (its rank, the process count)."""
    datamodule: Any
    module: LitModule
    from_data: dict[str, Any]
    """The model settings that came from the data (e.g. ``num_classes``), already merged into ``config.model``."""


def build_parts(cfg: SSSConfig, init_from: bool = False) -> Parts:
    """Build the data module and the module of `cfg`; ``cfg.model`` gets the settings that come from the data.

    The model's initial weights are seeded with ``trainer.seed`` (they are part of the run). With `init_from`
    (a fresh ``sss fit``), ``model.init_from`` then loads the encoders (`sss.run.init_from`); a resume,
    ``sss validate`` and ``sss export`` load trained weights instead and never read that folder.

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
    check_num_classes(cfg.model, datamodule)  # a data module may know its classes before it reads anything
    if hasattr(datamodule, "setup"):
        datamodule.setup("fit")  # reads (or makes) the data: classes and modalities are known after it
    check_num_classes(cfg.model, datamodule)
    set_seed(cfg.trainer.seed)  # the model's initial weights are part of the run
    from_data = sizes_from_data(cfg.model, datamodule)
    cfg.model = {**cfg.model, **from_data}  # an exported config.yaml must rebuild this very model
    spec, adapter = split_model_spec(cfg.model)  # model.adapter wraps the built model; it stays in the run's config
    module = instantiate(spec)
    _refuse_unlabelled_training(module, datamodule)
    _bind_to_weights(cfg, module, datamodule, state.is_main_process)
    if init_from and cfg.model.get("init_from"):  # after the pretrained encoders' reports: it loads over them
        _init_encoders(module, cfg.model["init_from"], state.is_main_process)
    if adapter is not None:  # before the trainer prepares the module: its optimizer takes what still trains
        from sss.models.adapter import apply_adapter

        summary = apply_adapter(module, adapter)
        if state.is_main_process:
            print(summary.line(), flush=True)
    return Parts(state=state, datamodule=datamodule, module=module, from_data=from_data)


def _bind_to_weights(cfg: SSSConfig, module: Any, datamodule: Any, main: bool) -> None:
    # What pretrained weights decide, once the module holding them is built:
    # 1. the exported config must rebuild this model without those weights (a model folder drops every
    #    pretrained-weight setting): the shape they gave (a Hugging Face model's config) goes in as plain values;
    export_settings = getattr(module, "export_settings", None)
    if callable(export_settings):
        cfg.model = {**cfg.model, **export_settings()}
    # 2. the data decodes as the weights expect (a pretrained image encoder's mean/std/resize filter), and a
    #    data.image_size that a fixed-size ViT's position table cannot take is refused here, before any step;
    bound, use = getattr(module, "preprocessing", None), getattr(datamodule, "use_model_preprocessing", None)
    if callable(bound) and callable(use):
        use(bound())
    # 3. the load report of each pretrained encoder: what was loaded, missing, unexpected, resized.
    for part in ("image_encoder", "audio_encoder"):
        report = getattr(getattr(module, part, None), "load_report", None)
        if main and callable(getattr(report, "summary", None)):
            print(f"sss: {report.summary()}", flush=True)


def _refuse_unlabelled_training(module: Any, datamodule: Any) -> None:
    # data.labels=optional reads a train split without labels (or with an empty label cell) as unlabelled: the
    # built-in supervised model's loss needs them and would fail at its first step, after the data was read.
    from sss.models.hunter import HunterModule

    train = getattr(datamodule, "datasets", {}).get("train")
    if not isinstance(module, HunterModule) or not getattr(train, "labels_optional", False):
        return
    dense = (train.has_events and module.event_head is not None) or (train.has_mask and module.mask_head is not None)
    if not train.has_label and not dense:  # the event and mask heads learn without class labels
        raise ConfigError(
            f"data.labels=optional read {train.source} as unlabelled ({train.unlabelled_rows} row(s) without a "
            f"label; a split with any empty label cell is unlabelled as a whole), but {type(module).__name__} "
            "trains on labels: label every row or drop the unlabelled ones, or pretrain on the pairs with sss "
            "pretrain (docs/pretrain.md)"
        )


def _init_encoders(module: Any, path: str, main: bool) -> None:
    from sss.run.init_from import init_encoders_from

    try:
        reports = init_encoders_from(module, path)
    except (FileNotFoundError, ValueError) as exc:
        raise ConfigError(str(exc)) from None
    for report in reports if main else ():
        print(f"sss: {report.summary()}", flush=True)


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
    if spec.get("num_classes") is None and classes:  # null, as left out: the data's count, not a default's
        sizes["num_classes"] = len(classes)
    modalities = tuple(getattr(datamodule, "modalities", ()) or ())
    if spec.get("_target_") == "sss.models.create_model" and "modalities" not in spec and len(modalities) == 1:
        sizes["modalities"] = list(modalities)
        if "fusion" not in spec:
            sizes["fusion"] = "late"  # there is nothing to attend across
    return sizes


def check_num_classes(spec: dict[str, Any], datamodule: Any) -> None:
    """Refuse a ``model.num_classes`` other than the number of classes the data module lists, before any step.

    A head with fewer logits than classes fails at the first batch that holds a higher label (``Target 3
    is out of bounds``), one with more trains logits no label ever names and fails at the export; the
    message names both counts and the override that fixes it. A data module without a class list yet
    (or none at all: segmentation) passes.

    Raises:
        ConfigError: The counts differ.

    Example:
        >>> class Data:
        ...     classes = ["mismatch", "match"]
        >>> check_num_classes({"num_classes": 4}, Data())  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        sss.config.errors.ConfigError: model.num_classes=4, but the data has 2 classes (mismatch, match): ...
    """
    classes, given = list(getattr(datamodule, "classes", None) or []), spec.get("num_classes")
    if not classes or given is None or given == len(classes):
        return
    shown = ", ".join(map(str, classes[:8])) + (", ..." if len(classes) > 8 else "")
    raise ConfigError(
        f"model.num_classes={given}, but the data has {len(classes)} classes ({shown}): add "
        f"model.num_classes={len(classes)} to the command (or remove model.num_classes from the config: the data "
        "then sets it)"
    )
