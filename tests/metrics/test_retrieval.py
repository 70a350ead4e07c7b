"""retrieval_metrics against a brute-force oracle in plain Python, and the cases whose answer is known by hand."""

from __future__ import annotations

import math
import random
import statistics

import pytest
import torch

from sss.metrics import retrieval as retrieval_module
from sss.metrics import retrieval_metrics

KS = (1, 2, 5, 10)


def _cosines(query: list[float], candidates: list[list[float]]) -> list[float]:
    def unit(v: list[float]) -> list[float]:
        norm = math.sqrt(sum(x * x for x in v))
        return [x / norm for x in v] if norm else [0.0] * len(v)  # no direction: similarity 0 to everything

    q = unit(query)
    return [sum(a * b for a, b in zip(q, unit(c), strict=True)) for c in candidates]


def _oracle(queries: list[list[float]], candidates: list[list[float]]) -> list[int]:
    """1-based rank of each query's own candidate: sort the candidates by similarity, ties put before the own one."""
    ranks = []
    for i, query in enumerate(queries):
        sims = _cosines(query, candidates)
        own = sims[i] - 1e-6  # the documented tolerance: float32 cosines that are equal in exact arithmetic
        order = sorted(range(len(candidates)), key=lambda j: (-sims[j], j != i))
        ahead = [j for j in order if j != i and sims[j] >= own]
        ranks.append(1 + len(ahead))
    return ranks


def _expected(image: torch.Tensor, audio: torch.Tensor, ks: tuple[int, ...]) -> dict[str, float]:
    if len(image) < 2:
        return {}
    out = {}
    for name, q, c in (("audio_to_image", audio, image), ("image_to_audio", image, audio)):
        ranks = _oracle(q.tolist(), c.tolist())
        for k in ks:
            out[f"retrieval/{name}_r{k}"] = sum(r <= k for r in ranks) / len(ranks)
        out[f"retrieval/{name}_median_rank"] = float(statistics.median(ranks))
    return out


def _planted(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Embeddings with exact ties: small integer vectors (zero rows too), duplicated rows, pairs equal to their mate."""
    rng = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    image = torch.randint(-1, 2, (n, 3), generator=g).float()
    audio = torch.randint(-1, 2, (n, 3), generator=g).float() * rng.choice([1.0, 2.5])  # scale must not matter
    for _ in range(n // 3):
        i, j = rng.randrange(n), rng.randrange(n)
        image[i] = image[j]  # a duplicate candidate
        audio[j] = image[j] * 3  # a pair pointing the same way
    return image, audio


@pytest.mark.parametrize("n", [1, 2, 7, 50])
@pytest.mark.parametrize("chunk_size", [None, 1, 3, 64])
def test_matches_the_oracle_with_ties_and_duplicates(n: int, chunk_size: int | None) -> None:
    for seed in range(3):
        image, audio = _planted(n, seed)
        got = retrieval_metrics(image, audio, ks=KS, chunk_size=chunk_size)
        assert got == pytest.approx(_expected(image, audio, KS), abs=1e-12), (n, chunk_size, seed)


@pytest.mark.parametrize("n", [2, 7, 50])
def test_matches_the_oracle_on_continuous_embeddings(n: int) -> None:
    g = torch.Generator().manual_seed(n)
    image = torch.randn(n, 8, generator=g)
    audio = image + torch.randn(n, 8, generator=g)  # correlated, so the ranks spread over 1..N
    got = retrieval_metrics(image, audio, ks=KS, chunk_size=5)
    assert got == pytest.approx(_expected(image, audio, KS), abs=1e-12)
    assert got == retrieval_metrics(image, audio, ks=KS)  # the chunk size does not change anything


def test_the_default_chunking_splits_the_queries(monkeypatch: pytest.MonkeyPatch) -> None:
    image, audio = _planted(50, 7)
    whole = retrieval_metrics(image, audio, ks=KS)
    monkeypatch.setattr(retrieval_module, "CHUNK_ELEMENTS", 120)  # 2 query rows per chunk
    seen: list[int] = []
    ranks = retrieval_module._ranks
    monkeypatch.setattr(retrieval_module, "_ranks", lambda q, c, rows: seen.append(rows) or ranks(q, c, rows))
    assert retrieval_metrics(image, audio, ks=KS) == whole
    assert seen == [2, 2]


def test_a_known_permutation() -> None:
    # One-hot embeddings, audio i = image sigma(i): a fixed point ranks 1; any other pair's similarity is 0,
    # tied with the N - 2 other zeros and beaten by image sigma(i): rank N.
    sigma = [0, 2, 1, 3, 5, 6, 4]
    m = retrieval_metrics(torch.eye(7), torch.eye(7)[sigma], ks=(1, 6, 7, 20))
    assert m["retrieval/audio_to_image_r1"] == m["retrieval/image_to_audio_r1"] == pytest.approx(2 / 7)
    assert m["retrieval/audio_to_image_r6"] == pytest.approx(2 / 7)
    assert m["retrieval/audio_to_image_r7"] == m["retrieval/image_to_audio_r20"] == 1.0
    assert m["retrieval/audio_to_image_median_rank"] == 7.0


def test_perfect_pairs_rank_first() -> None:
    image = torch.randn(30, 16, generator=torch.Generator().manual_seed(0))
    m = retrieval_metrics(image, 5 * image)
    assert m == {
        "retrieval/audio_to_image_r1": 1.0,
        "retrieval/audio_to_image_r5": 1.0,
        "retrieval/audio_to_image_r10": 1.0,
        "retrieval/audio_to_image_median_rank": 1.0,
        "retrieval/image_to_audio_r1": 1.0,
        "retrieval/image_to_audio_r5": 1.0,
        "retrieval/image_to_audio_r10": 1.0,
        "retrieval/image_to_audio_median_rank": 1.0,
    }


def test_a_collapsed_model_scores_zero_not_one() -> None:
    same = torch.full((12, 4), 0.3)
    noisy = same + 1e-7 * torch.randn(12, 4, generator=torch.Generator().manual_seed(0))  # rounding-level noise
    for image, audio in ((same, same), (noisy, same), (torch.zeros(12, 4), torch.zeros(12, 4))):
        m = retrieval_metrics(image, audio, ks=(1, 5, 12, 13))
        for way in ("audio_to_image", "image_to_audio"):
            assert m[f"retrieval/{way}_r1"] == m[f"retrieval/{way}_r5"] == 0.0
            assert m[f"retrieval/{way}_r12"] == m[f"retrieval/{way}_r13"] == 1.0  # k >= N
            assert m[f"retrieval/{way}_median_rank"] == 12.0


def test_the_two_directions_are_not_swapped() -> None:
    # The image encoder collapsed, the audio one did not. audio -> image: every image ties, all ranks 3.
    # image -> audio: image 2's own audio (1, 1) is the only one pointing its way (rank 1); the others tie (rank 3).
    image = torch.ones(3, 2)
    audio = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    m = retrieval_metrics(image, audio, ks=(1,))
    assert m["retrieval/audio_to_image_r1"] == 0.0
    assert m["retrieval/image_to_audio_r1"] == pytest.approx(1 / 3)
    assert m["retrieval/audio_to_image_median_rank"] == 3.0
    assert m["retrieval/image_to_audio_median_rank"] == 3.0
    swapped = retrieval_metrics(audio, image, ks=(1,))
    assert swapped["retrieval/audio_to_image_r1"] == pytest.approx(1 / 3)
    assert swapped["retrieval/image_to_audio_r1"] == 0.0


def test_fewer_than_two_pairs_give_nothing() -> None:
    assert retrieval_metrics(torch.randn(1, 4), torch.randn(1, 4)) == {}
    assert retrieval_metrics(torch.randn(0, 4), torch.randn(0, 4)) == {}


def test_deterministic_and_float32_whatever_the_input_dtype() -> None:
    g = torch.Generator().manual_seed(1)
    image, audio = torch.randn(40, 6, generator=g), torch.randn(40, 6, generator=g)
    first = retrieval_metrics(image, audio)
    assert first == retrieval_metrics(image.clone(), audio.clone())
    assert first == retrieval_metrics(image.double(), audio.double())
    assert retrieval_metrics(image.bfloat16(), audio.bfloat16()).keys() == first.keys()


@pytest.mark.parametrize(
    ("image", "audio", "ks", "message"),
    [
        (torch.randn(4, 3), torch.randn(5, 3), (1,), r"image and audio must be paired embeddings \[N, D\]"),
        (torch.randn(4), torch.randn(4), (1,), "got image \\(4,\\) and audio \\(4,\\)"),
        (torch.randn(4, 3), torch.randn(4, 3), (0,), "ks must be whole numbers >= 1"),
        (torch.full((4, 3), math.nan), torch.randn(4, 3), (1,), "image embeddings contain NaN or inf"),
    ],
)
def test_bad_input_is_refused(image: torch.Tensor, audio: torch.Tensor, ks: tuple[int, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        retrieval_metrics(image, audio, ks=ks)
