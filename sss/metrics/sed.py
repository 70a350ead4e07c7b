"""Sound event detection metrics: frame probabilities to events, then segment- and event-based scores.

The scores are those of Mesaros, Heittola & Virtanen (Appl. Sci. 2016) computed exactly as sed_eval
0.2.1 does (the DCASE reference implementation), including its conventions: precision is ``nan`` without any
system event, recall and the error rates are ``nan`` without any reference event, and the class-wise
F-score is the nan-mean over classes. sed_eval itself is only a test dependency.

An event is ``(class index, onset seconds, offset seconds)``; a file's events are a list of them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "Event",
    "event_based_metrics",
    "frames_to_events",
    "median_filter",
    "sed_metrics",
    "segment_based_metrics",
]

Event = tuple[int, float, float]
"""A sound event: ``(class index, onset, offset)``, times in seconds."""


def median_filter(probs: Tensor, frames: int) -> Tensor:
    """Running median over time of ``[T, K]`` or ``[N, T, K]`` frame values, per class.

    Edges repeat the first and last frame (scipy ``median_filter(mode="nearest")``).

    Args:
        probs: Frame values, time on the second-to-last dimension.
        frames: Odd window length in frames; 1 or less returns ``probs`` unchanged.

    Returns:
        A tensor like ``probs``.

    Example:
        >>> import torch
        >>> activity = torch.tensor([0.0, 1.0, 0.0, 0.0, 1.0, 1.0, 1.0])[:, None]
        >>> median_filter(activity, 3)[:, 0]  # the lone frame goes, the run stays
        tensor([0., 0., 0., 0., 1., 1., 1.])
    """
    if frames <= 1:
        return probs
    if frames % 2 == 0:
        raise ValueError(f"median_filter needs an odd number of frames, got {frames}")
    if probs.ndim not in (2, 3):
        raise ValueError(f"probs must be [T, K] or [N, T, K], got shape {tuple(probs.shape)}")
    steps = probs.shape[-2]
    half = frames // 2
    window = torch.arange(steps, device=probs.device)[:, None] + torch.arange(-half, half + 1, device=probs.device)
    return probs[..., window.clamp(0, steps - 1), :].median(dim=-2).values  # [..., T, frames, K] -> [..., T, K]


def frames_to_events(
    activity: Tensor, hop_seconds: float, *, threshold: float = 0.5, median_frames: int = 1
) -> list[Event]:
    """Frame probabilities ``[T, K]`` to events: threshold, median filter, contiguous runs.

    A frame is active when its probability is ``>= threshold``. As in the DCASE baselines, the median
    filter runs on the binarised activity (it removes runs and gaps shorter than half the window).
    A run of frames ``[s, e)`` becomes ``(k, s * hop_seconds, e * hop_seconds)``; events come sorted by
    class, then onset.

    Args:
        activity: Probabilities (or 0/1 targets) ``[T, K]``.
        hop_seconds: Seconds per frame.
        threshold: Probability at or above which a frame is active.
        median_frames: Odd median-filter window in frames (1: none).

    Returns:
        The events of the clip.

    Example:
        >>> import torch
        >>> probs = torch.tensor([[0.1, 0.9], [0.8, 0.9], [0.7, 0.2], [0.2, 0.1]])
        >>> frames_to_events(probs, hop_seconds=0.5)
        [(0, 0.5, 1.5), (1, 0.0, 1.0)]
    """
    if activity.ndim != 2:
        raise ValueError(f"activity must be [T, K] frame probabilities, got shape {tuple(activity.shape)}")
    active = median_filter((activity >= threshold).float(), median_frames) > 0.5
    # +1 where a run starts, -1 one frame past its end; class-major order pairs each start with its end
    edges = torch.diff(torch.nn.functional.pad(active.T.int(), (1, 1)), dim=1)
    starts, ends = (edges == 1).nonzero().tolist(), (edges == -1).nonzero()[:, 1].tolist()
    return [(k, start * hop_seconds, end * hop_seconds) for (k, start), end in zip(starts, ends, strict=True)]


def segment_based_metrics(
    reference: Sequence[Sequence[Event]],
    estimated: Sequence[Sequence[Event]],
    durations: Sequence[float],
    num_classes: int,
    *,
    time_resolution: float = 1.0,
) -> dict[str, float]:
    """Segment-based F1 and error rate over all files (sed_eval ``SegmentBasedMetrics``).

    Each file is cut into ``ceil(duration / time_resolution)`` segments; a class is active in a
    segment if one of its events overlaps it (segments ``floor(onset / res)`` to ``ceil(offset / res)``,
    clipped to the file). TP/FP/FN are counted over (segment, class) pairs; per segment
    ``S = min(FN, FP)``, ``D = max(0, FN - FP)``, ``I = max(0, FP - FN)``, and the rates divide their
    sums by the number of active reference (segment, class) pairs.

    Args:
        reference: Per file, the reference events.
        estimated: Per file, the system events.
        durations: Per file, its length in seconds.
        num_classes: ``K``.
        time_resolution: Segment length in seconds.

    Returns:
        ``segment_f1``, ``segment_precision``, ``segment_recall``, ``segment_er``,
        ``segment_substitution_rate``, ``segment_deletion_rate``, ``segment_insertion_rate``.

    Example:
        >>> ref = [[(0, 1.0, 1.5), (0, 4.0, 4.2), (1, 6.0, 9.0)]]
        >>> est = [[(0, 1.15, 1.55), (0, 4.3, 4.5), (1, 6.1, 8.5), (2, 2.0, 2.3)]]
        >>> m = segment_based_metrics(ref, est, durations=[10.0], num_classes=3)
        >>> round(m["segment_f1"], 4), round(m["segment_er"], 4)
        (0.9091, 0.2)
    """
    _check_files(reference, estimated, num_classes)
    if len(durations) != len(reference):
        raise ValueError(f"durations has {len(durations)} entries for {len(reference)} files")
    if time_resolution <= 0:
        raise ValueError(f"time_resolution must be > 0 seconds, got {time_resolution}")
    rolls = [
        (
            _event_roll(ref, duration, num_classes, time_resolution),
            _event_roll(est, duration, num_classes, time_resolution),
        )
        for ref, est, duration in zip(reference, estimated, durations, strict=True)
    ]
    ref_roll = torch.cat([r for r, _ in rolls]) if rolls else torch.zeros(0, num_classes, dtype=torch.bool)
    est_roll = torch.cat([e for _, e in rolls]) if rolls else torch.zeros(0, num_classes, dtype=torch.bool)
    n_ref, n_sys, n_tp = ref_roll.sum(dim=1), est_roll.sum(dim=1), (ref_roll & est_roll).sum(dim=1)
    subs = (torch.minimum(n_ref, n_sys) - n_tp).sum().item()
    dels = (n_ref - n_sys).clamp(min=0).sum().item()
    ins = (n_sys - n_ref).clamp(min=0).sum().item()
    return _scores("segment", n_tp.sum().item(), n_sys.sum().item(), n_ref.sum().item(), subs, dels, ins)


def event_based_metrics(
    reference: Sequence[Sequence[Event]],
    estimated: Sequence[Sequence[Event]],
    num_classes: int,
    *,
    t_collar: float = 0.2,
    percentage_of_length: float = 0.2,
    evaluate_onset: bool = True,
    evaluate_offset: bool = True,
) -> dict[str, float]:
    """Event-based (collar) F1 and error rate over all files (sed_eval ``EventBasedMetrics``, optimal matching).

    A system event matches a reference event of the same class when ``|onset difference| <= t_collar``
    and ``|offset difference| <= max(t_collar, percentage_of_length * reference length)`` (each test
    only if evaluated). Matches are one-to-one, a maximum bipartite matching per file. Leftover pairs
    that would match but for the label are substitutions; FP and FN exclude them.
    ``event_f1_classwise`` is the mean of the per-class F-scores that are defined (the class has both
    reference and system events), ``nan`` if none is.

    Args:
        reference: Per file, the reference events.
        estimated: Per file, the system events.
        num_classes: ``K``.
        t_collar: Onset (and minimum offset) tolerance in seconds; DCASE uses 0.2.
        percentage_of_length: Offset tolerance as a fraction of the reference length; DCASE uses 0.2
            (sed_eval's own default is 0.5).
        evaluate_onset: Test onsets.
        evaluate_offset: Test offsets.

    Returns:
        ``event_f1``, ``event_precision``, ``event_recall``, ``event_er``, ``event_substitution_rate``,
        ``event_deletion_rate``, ``event_insertion_rate``, ``event_f1_classwise``.

    Example:
        >>> ref = [[(0, 1.0, 1.5), (0, 4.0, 4.2), (1, 6.0, 9.0)]]
        >>> est = [[(0, 1.15, 1.55), (0, 4.3, 4.5), (1, 6.1, 8.5), (2, 2.0, 2.3)]]
        >>> m = event_based_metrics(ref, est, num_classes=3)
        >>> round(m["event_f1"], 4), round(m["event_er"], 4), m["event_f1_classwise"]
        (0.5714, 1.0, 0.75)
    """
    _check_files(reference, estimated, num_classes)
    if not (evaluate_onset or evaluate_offset):
        raise ValueError("event_based_metrics needs evaluate_onset or evaluate_offset (or both)")
    timing = _TimingTest(t_collar, percentage_of_length, evaluate_onset, evaluate_offset)
    labels: tuple[list[int], list[int], list[int]] = ([], [], [])  # classes of reference, system, matched events
    subs = 0
    for ref, est in zip(reference, estimated, strict=True):
        matching = _max_matching(_hit_graph(ref, est, timing))
        subs += _count_substitutions(ref, est, matching, timing)
        labels[0].extend(r[0] for r in ref)
        labels[1].extend(e[0] for e in est)
        labels[2].extend(ref[j][0] for j in matching)
    totals = torch.stack([torch.bincount(torch.tensor(x, dtype=torch.long), minlength=num_classes) for x in labels])
    n_ref, n_sys, n_tp = (row.sum().item() for row in totals)
    out = _scores("event", n_tp, n_sys, n_ref, subs, n_ref - n_tp - subs, n_sys - n_tp - subs)
    # A maximum matching of the whole file restricted to one class is a maximum matching of that class
    # (the graph has no edges across classes), so the class-wise TP are read off the same matching.
    class_f = [_f_measure(_div(tp, sys), _div(tp, ref)) for ref, sys, tp in totals.T.tolist()]
    defined = [f for f in class_f if not math.isnan(f)]
    return out | {"event_f1_classwise": sum(defined) / len(defined) if defined else float("nan")}


def sed_metrics(
    probs: Tensor,
    target: Tensor,
    clip_seconds: float | Tensor,
    *,
    threshold: float = 0.5,
    median_frames: int = 7,
    target_frames_per_second: float | None = None,
    t_collar: float = 0.2,
    percentage_of_length: float = 0.2,
    time_resolution: float = 1.0,
) -> dict[str, float]:
    """Segment- and event-based SED scores of a dataset of frame probabilities against frame targets.

    Reference events come from ``target >= 0.5`` without filtering, system events from
    ``probs >= threshold`` followed by a ``median_frames`` median filter (DCASE: 7). Each side's hop
    is ``clip_seconds / frames``, so the model's frame rate need not match the targets'.

    Args:
        probs: Event probabilities (after the sigmoid) ``[N, T', K]``.
        target: Frame targets in [0, 1] ``[N, T, K]``.
        clip_seconds: Clip length in seconds, one for all or a ``[N]`` tensor.
        threshold: Probability at or above which a frame is active.
        median_frames: Odd median-filter window in model frames.
        target_frames_per_second: The targets' frame rate, when ``T`` frames do not exactly tile the clip.
        t_collar: See `event_based_metrics`.
        percentage_of_length: See `event_based_metrics`.
        time_resolution: See `segment_based_metrics`.

    Returns:
        The keys of `segment_based_metrics` and `event_based_metrics` together.

    Example:
        >>> import torch
        >>> target = torch.zeros(2, 100, 3)
        >>> target[0, 10:30, 1] = 1.0  # 1.0-3.0 s of a 10-s clip
        >>> probs = torch.nn.functional.interpolate(target.transpose(1, 2), size=50).transpose(1, 2)
        >>> m = sed_metrics(probs, target, clip_seconds=10.0)
        >>> m["event_f1"], m["segment_er"]
        (1.0, 0.0)
    """
    if probs.ndim != 3 or target.ndim != 3 or probs.shape[0] != target.shape[0] or probs.shape[2] != target.shape[2]:
        raise ValueError(
            f"probs must be [N, T', K] and target [N, T, K] with the same N and K, "
            f"got probs {tuple(probs.shape)} and target {tuple(target.shape)}"
        )
    seconds = torch.as_tensor(clip_seconds, dtype=torch.float64).flatten()
    if seconds.numel() not in (1, probs.shape[0]):
        raise ValueError(f"clip_seconds must be one number or [N] = [{probs.shape[0]}], got {seconds.numel()} values")
    seconds = seconds.expand(probs.shape[0]).tolist()
    fps = target_frames_per_second
    reference = [frames_to_events(t, 1 / fps if fps else s / t.shape[0]) for t, s in zip(target, seconds, strict=True)]
    active = median_filter((probs >= threshold).float(), median_frames)  # the whole batch at once
    estimated = [frames_to_events(a, s / a.shape[0]) for a, s in zip(active, seconds, strict=True)]
    segment = segment_based_metrics(reference, estimated, seconds, probs.shape[2], time_resolution=time_resolution)
    event = event_based_metrics(
        reference, estimated, probs.shape[2], t_collar=t_collar, percentage_of_length=percentage_of_length
    )
    return segment | event


@dataclass(frozen=True)
class _TimingTest:
    """sed_eval's onset/offset conditions for a (reference, system) pair, label not checked."""

    t_collar: float
    percentage_of_length: float
    onset: bool
    offset: bool

    def __call__(self, ref: Event, est: Event) -> bool:
        if self.onset and abs(ref[1] - est[1]) > self.t_collar:
            return False
        offset_collar = max(self.t_collar, self.percentage_of_length * (ref[2] - ref[1]))
        return not self.offset or abs(ref[2] - est[2]) <= offset_collar


def _hit_graph(ref: Sequence[Event], est: Sequence[Event], timing: _TimingTest) -> dict[int, list[int]]:
    """System event -> the reference events it matches (same class, timing within the collars).

    Built in sed_eval's order (a reference-major scan of its hit matrix): the matching algorithm's
    visiting order, and so which events stay unmatched, follows from it.
    """
    graph: dict[int, list[int]] = {}
    for j, r in enumerate(ref):
        for i, e in enumerate(est):
            if r[0] == e[0] and timing(r, e):
                graph.setdefault(i, []).append(j)
    return graph


def _max_matching(graph: dict[int, list[int]]) -> dict[int, int]:
    """Maximum bipartite matching (Hopcroft-Karp) of system -> reference edges; returns reference -> system.

    The visiting order is exactly that of sed_eval's ``bipartite_match`` (from mir_eval): where several
    maximum matchings exist, which events stay unmatched decides the substitutions, so only the same
    order gives sed_eval's numbers.
    """
    matching: dict[int, int] = {}
    for u, vs in graph.items():  # greedy start
        free_v = next((v for v in vs if v not in matching), None)
        if free_v is not None:
            matching[free_v] = u
    while True:
        # Layer the residual graph from the unmatched system events; pred[u] is None in the first layer.
        matched_u = set(matching.values())
        pred: dict[int, int | None] = {u: None for u in graph if u not in matched_u}
        preds: dict[int, list[int]] = {}
        unmatched: list[int] = []
        layer = list(pred)
        while layer and not unmatched:
            new_layer: dict[int, list[int]] = {}
            for u in layer:
                for v in graph[u]:
                    if v not in preds:
                        new_layer.setdefault(v, []).append(u)
            layer = []
            for v, us in new_layer.items():
                preds[v] = us
                if v in matching:
                    layer.append(matching[v])
                    pred[matching[v]] = v
                else:
                    unmatched.append(v)
        if not unmatched:
            return matching
        for v in unmatched:
            _augment(v, matching, pred, preds)


def _augment(v: int, matching: dict[int, int], pred: dict[int, int | None], preds: dict[int, list[int]]) -> bool:
    """Search back through the layers for an alternating path ending at ``v``; flip it if found."""
    for u in preds.pop(v, []):
        if u in pred:
            pu = pred.pop(u)
            if pu is None or _augment(pu, matching, pred, preds):
                matching[v] = u
                return True
    return False


def _count_substitutions(
    ref: Sequence[Event], est: Sequence[Event], matching: dict[int, int], timing: _TimingTest
) -> int:
    """Greedy label-agnostic pairing of the unmatched events, reference-major as sed_eval does."""
    matched = set(matching.values())
    sys_left = [i for i in range(len(est)) if i not in matched]
    counted: set[int] = set()
    for j in (j for j in range(len(ref)) if j not in matching):
        hit = next((i for i in sys_left if i not in counted and timing(ref[j], est[i])), None)
        if hit is not None:
            counted.add(hit)
    return len(counted)


def _event_roll(events: Sequence[Event], duration: float, num_classes: int, resolution: float) -> Tensor:
    """Segment activity ``[ceil(duration / resolution), K]`` of one file, on sed_eval's grid."""
    roll = torch.zeros(math.ceil(duration / resolution), num_classes, dtype=torch.bool)
    for k, onset, offset in events:
        roll[math.floor(onset / resolution) : math.ceil(offset / resolution), k] = True
    return roll


def _check_files(reference: Sequence[Sequence[Event]], estimated: Sequence[Sequence[Event]], num_classes: int) -> None:
    if len(reference) != len(estimated):
        raise ValueError(f"reference has {len(reference)} files but estimated has {len(estimated)}")
    for name, files in (("reference", reference), ("estimated", estimated)):
        for events in files:
            for event in events:
                k, onset, offset = event
                if not (0 <= k < num_classes and 0 <= onset <= offset):
                    raise ValueError(
                        f"{name} has an invalid event {event}: expected (class in [0, {num_classes}), "
                        "onset >= 0, offset >= onset)"
                    )


def _scores(prefix: str, tp: int, n_sys: int, n_ref: int, subs: int, dels: int, ins: int) -> dict[str, float]:
    """sed_eval's overall F-score and error rates from the counts."""
    precision, recall = _div(tp, n_sys), _div(tp, n_ref)
    # sed_eval divides the error counts by Nref + eps and so reports 0 or ~1e15 without reference
    # events; nan says "undefined" instead, as its recall does.
    rates = {
        "substitution_rate": _div(subs, n_ref),
        "deletion_rate": _div(dels, n_ref),
        "insertion_rate": _div(ins, n_ref),
    }
    out = {"f1": _f_measure(precision, recall), "precision": precision, "recall": recall, "er": sum(rates.values())}
    return {f"{prefix}_{key}": float(value) for key, value in (out | rates).items()}


def _div(num: float, den: float) -> float:
    return num / den if den else float("nan")


def _f_measure(precision: float, recall: float) -> float:
    # sed_eval: 0 when both are 0, nan when either is nan
    return 0.0 if precision == 0 and recall == 0 else 2 * precision * recall / (precision + recall)
