"""SED metrics: a worked example from the definitions, and random datasets against sed_eval 0.2.1 itself."""

from __future__ import annotations

import math
import random
import warnings

import numpy as np
import pytest
import torch
from scipy import ndimage

from sss.metrics import event_based_metrics, frames_to_events, median_filter, sed_metrics, segment_based_metrics

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # dcase_util still imports pkg_resources
    import dcase_util
    import sed_eval

KNOCK, FRICTION, COLLISION = 0, 1, 2
ORACLE_REF = [[(KNOCK, 1.0, 1.5), (KNOCK, 4.0, 4.2), (FRICTION, 6.0, 9.0)]]
ORACLE_SYS = [[(KNOCK, 1.15, 1.55), (KNOCK, 4.3, 4.5), (FRICTION, 6.1, 8.5), (COLLISION, 2.0, 2.3)]]


def assert_same(ours: dict[str, float], expected: dict[str, float]) -> None:
    for key, value in expected.items():
        if math.isnan(value):
            assert math.isnan(ours[key]), key
        else:
            assert ours[key] == pytest.approx(value, abs=1e-6), key


def test_event_based_oracle():
    m = event_based_metrics(ORACLE_REF, ORACLE_SYS, num_classes=3)
    assert_same(
        m,
        {
            "event_precision": 0.5,
            "event_recall": 2 / 3,
            "event_f1": 4 / 7,
            "event_er": 1.0,
            "event_substitution_rate": 0.0,
            "event_deletion_rate": 1 / 3,
            "event_insertion_rate": 2 / 3,
            "event_f1_classwise": 0.75,  # knock 0.5, friction 1.0, collision nan
        },
    )
    onset_only = event_based_metrics(ORACLE_REF, ORACLE_SYS, num_classes=3, evaluate_offset=False)
    assert onset_only["event_f1"] == pytest.approx(4 / 7)


def test_segment_based_oracle():
    m = segment_based_metrics(ORACLE_REF, ORACLE_SYS, durations=[10.0], num_classes=3)
    expected = {"segment_precision": 5 / 6, "segment_recall": 1.0, "segment_f1": 10 / 11, "segment_er": 0.2}
    assert_same(m, expected | {"segment_insertion_rate": 0.2, "segment_substitution_rate": 0.0})


# ---------------------------------------------------------------- sed_eval on random datasets


def sed_eval_scores(reference, estimated, durations, num_classes, **event_kwargs):
    """The same dataset through sed_eval, one MetaDataContainer per file, renamed to our keys."""
    labels = [f"class{k}" for k in range(num_classes)]
    segment = sed_eval.sound_event.SegmentBasedMetrics(labels, time_resolution=event_kwargs.pop("time_resolution", 1.0))
    event = sed_eval.sound_event.EventBasedMetrics(labels, t_collar=0.2, percentage_of_length=0.2, **event_kwargs)
    for i, (ref, est, duration) in enumerate(zip(reference, estimated, durations, strict=True)):
        containers = [
            dcase_util.containers.MetaDataContainer(
                [
                    {"filename": f"{i}.wav", "event_label": labels[k], "onset": on, "offset": off}
                    for k, on, off in events
                ]
            )
            for events in (ref, est)
        ]
        segment.evaluate(*containers, evaluated_length_seconds=duration)
        event.evaluate(*containers)
    out = {}
    for prefix, metrics in (("segment", segment), ("event", event)):
        overall = metrics.results_overall_metrics()
        out |= {f"{prefix}_f1": overall["f_measure"]["f_measure"]}
        out |= {f"{prefix}_{key}": overall["f_measure"][key] for key in ("precision", "recall")}
        out |= {f"{prefix}_{key.replace('error_rate', 'er')}": v for key, v in overall["error_rate"].items()}
    out["event_f1_classwise"] = event.results_class_wise_average_metrics()["f_measure"]["f_measure"]
    return out


def random_dataset(seed: int, files: int, num_classes: int, duration: float = 10.0):
    """Reference events and a noisy system output: jittered copies, relabelled ones, misses and extras.

    Times sit on a 0.05-s grid so that collar boundaries (|difference| == 0.2) and segment
    boundaries are hit often; some events end exactly at the clip end, some files are empty.
    """
    rng = random.Random(seed)
    reference, estimated = [], []
    for _ in range(files):
        ref = []
        for _ in range(rng.choice([0, 0, 1, 2, 4, 6])):
            onset = round(rng.uniform(0, duration - 0.1), 2)
            offset = duration if rng.random() < 0.15 else min(duration, round(onset + rng.uniform(0.05, 3), 2))
            ref.append((rng.randrange(num_classes), onset, offset))
        est = []
        for k, onset, offset in ref:
            if rng.random() < 0.2:
                continue  # missed
            k = rng.randrange(num_classes) if rng.random() < 0.25 else k
            onset = min(duration, max(0.0, round(onset + rng.choice([-0.25, -0.2, -0.1, 0.0, 0.05, 0.2, 0.3]), 2)))
            offset = min(duration, max(onset, round(offset + rng.choice([-0.5, -0.2, 0.0, 0.1, 0.2, 0.6]), 2)))
            est.append((k, onset, offset))
        for _ in range(rng.choice([0, 0, 1, 2])):
            onset = round(rng.uniform(0, duration - 0.1), 2)
            est.append((rng.randrange(num_classes), onset, min(duration, round(onset + rng.uniform(0.05, 2), 2))))
        rng.shuffle(est)
        reference.append(ref)
        estimated.append(est)
    return reference, estimated, [duration] * files


@pytest.mark.parametrize("seed, files, num_classes", [(0, 30, 3), (1, 60, 5), (2, 20, 1), (3, 40, 8)])
def test_random_datasets_match_sed_eval(seed, files, num_classes):
    reference, estimated, durations = random_dataset(seed, files, num_classes)
    ours = segment_based_metrics(reference, estimated, durations, num_classes) | event_based_metrics(
        reference, estimated, num_classes
    )
    assert_same(ours, sed_eval_scores(reference, estimated, durations, num_classes))


@pytest.mark.parametrize("onset, offset", [(True, False), (False, True)])
def test_onset_only_and_offset_only_match_sed_eval(onset, offset):
    reference, estimated, durations = random_dataset(4, 40, 4)
    ours = event_based_metrics(reference, estimated, 4, evaluate_onset=onset, evaluate_offset=offset)
    theirs = sed_eval_scores(reference, estimated, durations, 4, evaluate_onset=onset, evaluate_offset=offset)
    assert_same(ours, {k: v for k, v in theirs.items() if k.startswith("event")})


def test_half_second_segments_match_sed_eval():
    reference, estimated, durations = random_dataset(5, 30, 3, duration=4.3)  # a partial last segment
    ours = segment_based_metrics(reference, estimated, durations, 3, time_resolution=0.5)
    theirs = sed_eval_scores(reference, estimated, durations, 3, time_resolution=0.5)
    assert_same(ours, {k: v for k, v in theirs.items() if k.startswith("segment")})


def test_ambiguous_matchings_give_sed_eval_substitutions():
    """Crowded files where several maximum matchings exist: which events stay unmatched decides the
    substitutions, so this checks that the matching visits events in sed_eval's order."""
    rng = random.Random(6)

    def crowded(n: int) -> list[tuple[int, float, float]]:  # n half-second events of 2 classes within 2 s
        return [(rng.randrange(2), o, o + 0.5) for o in (round(rng.uniform(0, 1.5), 1) for _ in range(n))]

    reference, estimated = [], []
    for _ in range(150):
        reference.append(crowded(rng.randrange(1, 6)))
        estimated.append(crowded(rng.randrange(1, 6)))
    ours = event_based_metrics(reference, estimated, 2)
    theirs = sed_eval_scores(reference, estimated, [2.0] * len(reference), 2)
    assert theirs["event_substitution_rate"] > 0
    assert_same(ours, {k: v for k, v in theirs.items() if k.startswith("event")})


@pytest.mark.filterwarnings("ignore:Mean of empty slice:RuntimeWarning")  # sed_eval's nan-mean of all-nan
def test_no_system_events_and_no_reference_events():
    reference, estimated, durations = [[(0, 1.0, 2.0)], []], [[], []], [5.0, 5.0]
    m = segment_based_metrics(reference, estimated, durations, 2) | event_based_metrics(reference, estimated, 2)
    assert_same(m, sed_eval_scores(reference, estimated, durations, 2))  # precision and F1 nan, ER 1.0
    assert math.isnan(m["event_f1_classwise"])
    # Without any reference event sed_eval divides by Nref + eps (0 or ~1e15); we report nan.
    empty = event_based_metrics([[]], [[(0, 1.0, 2.0)]], 2) | segment_based_metrics([[]], [[(0, 1.0, 2.0)]], [5.0], 2)
    assert all(math.isnan(empty[f"{p}_{k}"]) for p in ("event", "segment") for k in ("er", "recall", "insertion_rate"))
    assert empty["event_precision"] == 0.0


# ---------------------------------------------------------------- frames to events


def naive_events(active: np.ndarray, hop: float) -> list[tuple[int, float, float]]:
    events = []
    for k in range(active.shape[1]):
        t = 0
        while t < len(active):
            if active[t, k]:
                end = t
                while end < len(active) and active[end, k]:
                    end += 1
                events.append((k, t * hop, end * hop))
                t = end
            t += 1
    return events


@pytest.mark.parametrize("frames", [1, 3, 7])
def test_median_filter_matches_scipy_nearest(frames):
    x = torch.rand(4, 50, 3, generator=torch.Generator().manual_seed(frames))
    expected = ndimage.median_filter(x.numpy(), size=(1, frames, 1), mode="nearest")
    torch.testing.assert_close(median_filter(x, frames), torch.from_numpy(expected))
    torch.testing.assert_close(median_filter(x[1], frames), torch.from_numpy(expected[1]))


def test_frames_to_events_runs_touch_both_clip_ends():
    probs = torch.tensor([[0.9, 0.5], [0.9, 0.49], [0.1, 0.5], [0.6, 0.5]])
    assert frames_to_events(probs, 0.25) == [(0, 0.0, 0.5), (0, 0.75, 1.0), (1, 0.0, 0.25), (1, 0.5, 1.0)]
    assert frames_to_events(torch.zeros(5, 2), 0.1) == []


def test_frames_to_events_filters_the_binarised_activity():
    probs = torch.tensor([0.0, 0.9, 0.0, 0.0, 0.8, 0.6, 0.7, 0.0, 0.9])[:, None]
    # the lone active frame 1 goes, the one-frame gap at 7 is filled, the last frame survives by edge repeat
    assert frames_to_events(probs, 1.0, median_frames=3) == [(0, 4.0, 9.0)]


def test_sed_metrics_matches_sed_eval_on_independently_decoded_events():
    gen = torch.Generator().manual_seed(7)
    target = (torch.rand(12, 40, 3, generator=gen) > 0.7).float()
    target = torch.from_numpy(ndimage.median_filter(target.numpy(), size=(1, 5, 1), mode="nearest"))  # longer runs
    target[:2] = 0.0  # clips without events
    probs = torch.nn.functional.interpolate(target.transpose(1, 2), size=25) + 0.4 * torch.rand(
        12, 3, 25, generator=gen
    )
    probs = probs.transpose(1, 2).clamp(0, 1)
    seconds = torch.full((12,), 8.0)
    seconds[3] = 5.0
    ours = sed_metrics(probs, target, seconds, median_frames=3)
    active = ndimage.median_filter((probs >= 0.5).numpy(), size=(1, 3, 1), mode="nearest")
    reference = [naive_events(target[i].numpy() >= 0.5, seconds[i].item() / 40) for i in range(12)]
    estimated = [naive_events(active[i], seconds[i].item() / 25) for i in range(12)]
    assert_same(ours, sed_eval_scores(reference, estimated, seconds.tolist(), 3))


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: median_filter(torch.rand(10, 2), 4), "odd number of frames"),
        (lambda: median_filter(torch.rand(10), 3), r"\[T, K\] or \[N, T, K\], got shape \(10,\)"),
        (lambda: frames_to_events(torch.rand(2, 10, 2), 0.1), r"activity must be \[T, K\].*\(2, 10, 2\)"),
        (lambda: event_based_metrics([[]], [[], []], 2), "reference has 1 files but estimated has 2"),
        (lambda: event_based_metrics([[(2, 0.0, 1.0)]], [[]], 2), r"reference has an invalid event \(2, 0.0, 1.0\)"),
        (lambda: segment_based_metrics([[]], [[(0, 2.0, 1.0)]], [5.0], 2), "estimated has an invalid event"),
        (lambda: segment_based_metrics([[]], [[]], [5.0, 5.0], 2), "durations has 2 entries for 1 files"),
        (lambda: event_based_metrics([[]], [[]], 2, evaluate_onset=False, evaluate_offset=False), "evaluate_onset"),
        (lambda: sed_metrics(torch.rand(2, 10, 3), torch.rand(2, 20, 4), 10.0), r"same N and K.*\(2, 20, 4\)"),
        (lambda: sed_metrics(torch.rand(2, 10, 3), torch.rand(2, 20, 3), torch.ones(3)), "clip_seconds must be"),
    ],
)
def test_bad_input_is_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()
