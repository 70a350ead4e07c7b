"""`StreamDataset`: each sample once per epoch across processes x workers, equal steps, O(1) exact resume."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import DataLoader

from sss.config.errors import ConfigError
from sss.data._skiplog import SkipLog
from sss.data.errors import DataError
from sss.data.records import Record, Shard, Source, record_error
from sss.data.stream import StreamDataset


class Numbers(Source):
    """Shards of numbered records; `reads` counts the records read, `bad` holds indices that fail to read."""

    def __init__(self, sizes: list[int], bad: set[int] = frozenset()) -> None:  # type: ignore[assignment]
        super().__init__("nums", [Shard(f"s{i}.tar", n) for i, n in enumerate(sizes)], ["x"], ())
        self.starts = list(itertools.accumulate(sizes, initial=0))
        self.bad, self.reads = bad, torch.zeros((), dtype=torch.int64).share_memory_()

    def read(self, shard, start=0, stop=None):
        for row in range(start, self.shards[shard].rows if stop is None else stop):
            self.reads += 1
            index = self.starts[shard] + row
            if index in self.bad:
                yield record_error(self.shards[shard].path, row, str(index), "is corrupt")
            else:
                yield Record(self.shards[shard].path, row, str(index), target=index)


def decode(record: Record, index: int) -> dict[str, int]:
    assert record.target == index  # the index a stream hands the decoder is the sample's stored position
    return {"index": index, "noise": torch.rand(()).item()}  # noise: the per-sample seeded draws


def batches(source, *, rank=0, world=1, workers=0, batch=4, epoch=0, start=0, **kw) -> list[list[int]]:
    stream = StreamDataset(source, decode, batch_size=batch, num_workers=workers, rank=rank, world=world, **kw)
    stream.set_epoch(epoch)
    stream.start_at(start)
    loader = DataLoader(stream, batch_size=batch, num_workers=workers)
    out = [b["index"].tolist() for b in loader]
    assert len(out) <= len(loader)
    return out


def _flat(runs: list[list[int]]) -> list[int]:
    return [i for run in runs for i in run]


@pytest.mark.parametrize("workers", [0, 2])
def test_every_sample_once_per_epoch_with_equal_steps_per_rank(workers):
    source = Numbers([7, 11, 5, 9, 6])  # 38 samples in 5 uneven shards, for 2 processes x 2 workers
    for epoch in (0, 1):
        runs = [batches(source, rank=r, world=2, workers=workers, epoch=epoch, shuffle_buffer=4) for r in (0, 1)]
        seen = [i for run in runs for b in run for i in b]
        assert len(seen) == len(set(seen))  # nobody reads a sample twice
        readers = 2 * max(workers, 1)
        assert len(seen) == 38 // readers * readers  # all but the < readers left over
        assert len(runs[0]) == len(runs[1])  # equal steps: no rank waits in a collective for another
    first, second = (batches(source, world=1, epoch=e) for e in (0, 1))
    assert first != second and sorted(_flat(first)) == sorted(_flat(second))  # reshuffled per epoch
    assert batches(source, epoch=0) == first  # a function of (seed, epoch)


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_resume_at_any_batch_gives_the_rest_of_the_straight_run_without_reading_before_it(workers):
    source = Numbers([10, 10, 10, 10, 10, 10])
    straight = batches(source, workers=workers, batch=3, shuffle_buffer=4)
    for start in range(len(straight) + 1):  # every place, the epoch's end included
        before = int(source.reads)
        assert batches(source, workers=workers, batch=3, shuffle_buffer=4, start=start) == straight[start:]
        read = int(source.reads) - before
        assert read <= 60 - start * 3 + max(workers, 1) * 4  # the rest plus at most one window per reader


def test_a_stream_the_processes_cannot_feed_is_one_error_with_the_numbers_and_the_fix():
    with pytest.raises(DataError, match=r"3 shard\(s\) of 30 sample\(s\) cannot feed 2 process\(es\) × 2 worker"):
        StreamDataset(Numbers([10, 10, 10]), decode, batch_size=4, num_workers=2, world=2)
    with pytest.raises(DataError, match=r"--shard-size 7"):
        StreamDataset(Numbers([10, 10, 10]), decode, batch_size=4, num_workers=2, world=2)


def test_bad_samples_raise_or_give_way_to_the_next_good_one_of_their_window(tmp_path):
    with pytest.raises(DataError, match=r"s0.tar, sample 2 \(key 2\): is corrupt"):
        batches(Numbers([6, 6], bad={2}), shuffle=False)
    log = SkipLog(tmp_path / "skipped.csv")
    served = _flat(batches(Numbers([6, 6], bad={2}), shuffle=False, on_error="skip", skip_log=log, batch=6))
    assert served == [0, 1, 3, 3, 4, 5, 6, 7, 8, 9, 10, 11]  # same count and shapes: the next good one serves
    assert [(r["manifest"], r["row"]) for r in log.rows()] == [("s0.tar", 2)]


def test_augmentation_draws_depend_on_the_sample_and_epoch_only():
    source = Numbers([8, 8])
    stream = StreamDataset(source, decode, batch_size=4, shuffle_buffer=4)
    draws = {item["index"]: item["noise"] for item in stream}
    resumed = StreamDataset(source, decode, batch_size=4, shuffle_buffer=4)
    resumed.start_at(2)
    assert all(draws[item["index"]] == item["noise"] for item in resumed)


def test_a_checkpoint_of_another_plan_is_refused():
    stream = StreamDataset(Numbers([8, 8, 8, 8]), decode, batch_size=2, num_workers=2, world=1, shuffle_buffer=4)
    saved = {**stream.position(1, 3), "processes": 1}
    assert saved["readers"] == [[saved["readers"][0][0], 4, 1, 0], [saved["readers"][1][0], 2, 0, 2]]
    stream.check_resume(saved, 1, 3, 1)  # the same plan: accepted
    other = StreamDataset(Numbers([8, 8, 8, 9]), decode, batch_size=2, num_workers=2, world=1, shuffle_buffer=4)
    with pytest.raises(ConfigError, match=r"shards, data\.seed, data\.num_workers"):
        other.check_resume(saved, 1, 3, 1)
    with pytest.raises(ConfigError, match="resume_resize cannot continue a stream"):
        stream.check_resume({**saved, "processes": 2}, 1, 3, 1)
