"""``sss data``: write the synthetic dataset (``make``) or pack a dataset folder into tar shards (``pack``).

A plain typed function, as every subcommand of `sss.run.commands`: `sss.cli` builds its parser from the
signature and the docstring.
"""

from __future__ import annotations

import sys
from typing import Any, Literal

from sss.run.commands import EXIT_CONFIG, missing_rates

__all__ = ["data"]


def data(
    action: Literal["make", "pack"],
    kind: str,
    out: str,
    n: int = 2000,
    n_val: int | None = None,
    n_test: int | None = None,
    seed: int = 0,
    image_size: int = 64,
    sample_rate: int = 16000,
    clip_seconds: float = 1.0,
    task: Literal["default", "binding", "redundant", "shared"] = "default",
    missing: list[str] | None = None,
    shard_size: int = 1000,
    layout: Literal["manifest", "esc50", "urbansound8k", "desed", "istd", "sbu"] = "manifest",
    fold: int | None = None,
    on_error: Literal["raise", "skip"] = "raise",
    allow_outside_root: bool = False,
) -> int:
    """``sss data make industrial OUT``: write the synthetic industrial dataset (train/val/test) to OUT.
    ``sss data pack SRC OUT --shard-size N``: write the dataset folder SRC as tar shards to OUT (data.layout=shards).

    Args:
        kind: make: the dataset to write (industrial); pack: SRC, the dataset folder to pack
        out: output folder
        n: training samples
        n_val: validation samples (default n/5)
        n_test: test samples (default n/5)
        image_size: image side in pixels
        sample_rate: audio sample rate in Hz
        clip_seconds: audio clip length
        task: binding: match / mismatch, whether a grille shadow's slat angle (0 or 90 degrees) and a sound
            (beep or hiss) agree; each modality alone is at chance. redundant: four machines, each shown by its
            grille's slat angle and heard by its own sound, the image corrupted in 5 of 100 samples, the audio in 30.
            shared: sixteen machine types, each seen (grille pattern, pitch) and heard (sound kind, band), faintly;
            the four classes group the types so that neither factor alone tells them (for contrastive pretraining)
        missing: leave MODALITY's cells empty in a seeded fraction RATE of the rows of each split, never both in
            one row, e.g. image=0.3 (repeat for both: --missing image=0.3 --missing audio=0.2)
        shard_size: pack: samples per shard
        layout: pack: how SRC is laid out (as data.layout)
        fold: pack: the held-out fold of esc50 / urbansound8k (as data.fold)
        on_error: pack: raise: a bad row stops the pack; skip: it is left out and listed in OUT/skipped.csv
        allow_outside_root: pack: accept paths that leave SRC (as data.allow_outside_root)
    """
    refused = _data_flags_of_the_other_action(action, locals())
    if refused:
        return refused
    if action == "pack":
        return _data_pack(kind, out, shard_size, layout, fold, on_error, allow_outside_root)
    return _data_make(kind, out, n, n_val, n_test, seed, image_size, sample_rate, clip_seconds, task, missing)


def _data_make(
    kind: str,
    out: str,
    n: int,
    n_val: int | None,
    n_test: int | None,
    seed: int,
    image_size: int,
    sample_rate: int,
    clip_seconds: float,
    task: str,
    missing: list[str] | None = None,
) -> int:
    """``sss data make``: the generator's limits said with the flags' names (exit code 2), then the dataset."""
    if kind != "industrial":  # argparse's words, from when this was a choice of the parser
        print(f"sss data: error: argument kind: invalid choice: {kind!r} (choose from 'industrial')", file=sys.stderr)
        return EXIT_CONFIG
    n_val = max(1, n // 5) if n_val is None else n_val
    n_test = max(1, n // 5) if n_test is None else n_test
    # The generator's own limits, said with the flags' names (it says n_train, which no flag is called).
    limits = [
        ("--n", n, n >= 1, "at least 1"),
        ("--n-val", n_val, n_val >= 0, "0 or more"),
        ("--n-test", n_test, n_test >= 0, "0 or more"),
        ("--image-size", image_size, image_size >= 16, "at least 16 (pixels)"),
        ("--sample-rate", sample_rate, sample_rate >= 16000, "at least 16000 (the sounds reach 7 kHz)"),
        ("--clip-seconds", clip_seconds, clip_seconds >= 0.5, "at least 0.5 (room for a transient)"),
    ]
    for flag, value, ok, need in limits:
        if not ok:
            print(f"error: sss data make {flag} {value}: must be {need}", file=sys.stderr)
            return EXIT_CONFIG
    from sss.data import make_industrial

    sizes = {"n_train": n, "n_val": n_val, "n_test": n_test, "image_size": image_size}
    sound = {"sample_rate": sample_rate, "clip_seconds": clip_seconds}
    try:
        rates = missing_rates(missing)  # its messages name the flag: --missing image=2: the rate must be in [0, 1]
    except ValueError as exc:
        print(f"error: sss data make {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if sum(rates.values()) > 1:
        given = " ".join(f"--missing {item}" for item in missing or [])
        print(
            f"error: sss data make {given}: the rates add up to more than 1, but a row lacks one modality at most",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    print(f"wrote {make_industrial(out, seed=seed, task=task, missing=rates, **sizes, **sound)}")
    return 0


_DATA_MAKE_FLAGS = ("n", "n_val", "n_test", "seed", "image_size", "sample_rate", "clip_seconds", "task", "missing")
_DATA_PACK_FLAGS = ("shard_size", "layout", "fold", "on_error", "allow_outside_root")


def _data_flags_of_the_other_action(action: str, given: dict[str, Any]) -> int:
    """Refuse the flags (given, not at their defaults) of the other ``sss data`` action: silently ignored, a flag
    would look as if it had done something. Exit code 2 with one line, or 0 when there are none."""
    import inspect

    defaults = {name: p.default for name, p in inspect.signature(data).parameters.items()}
    names = _DATA_PACK_FLAGS if action == "make" else _DATA_MAKE_FLAGS
    flags = " ".join(f"--{name.replace('_', '-')}" for name in names if given[name] != defaults[name])
    if not flags:
        return 0
    other = "pack" if action == "make" else "make"
    print(f"error: sss data {action}: {flags}: only with sss data {other}", file=sys.stderr)
    return EXIT_CONFIG


def _data_pack(
    src: str, out: str, shard_size: int, layout: str, fold: int | None, on_error: str, allow_outside_root: bool
) -> int:
    """``sss data pack``: bad input (a count, a row, an existing OUT) is one line and exit code 2."""
    if shard_size < 1:
        print(f"error: sss data pack --shard-size {shard_size}: must be at least 1", file=sys.stderr)
        return EXIT_CONFIG
    from sss.data import DataError
    from sss.data.shards import pack

    try:
        report = pack(
            src, out, shard_size=shard_size, layout=layout, fold=fold, on_error=on_error,
            allow_outside_root=allow_outside_root,
        )  # fmt: skip
    except (DataError, FileExistsError) as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_CONFIG
    skipped = (
        f"; {len(report.skipped)} row(s) skipped, listed in {report.out / 'skipped.csv'}" if report.skipped else ""
    )
    print(f"wrote {report.out}{skipped}")
    return 0
