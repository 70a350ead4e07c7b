"""The batch contract (`sss.data.contract`): each known key's dtype and shape, one message per mistake."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from sss.data.contract import BATCH_KEYS, BatchFormatError, check_batch

B = 4
AUDIO = {"audio": torch.zeros(B, 1, 160)}
WHERE = "the first training batch"


@pytest.mark.parametrize(
    "batch",
    [
        {"image": torch.zeros(B, 3, 8, 8), "audio": torch.zeros(B, 1, 160), "label": torch.arange(B)},
        {"audio": torch.zeros(B, 160), "labels": torch.zeros(B, 5)},  # mono [B, S], multi-label
        {"audio": torch.zeros(B, 2, 160, dtype=torch.float16), "index": torch.arange(B)},  # stereo, half
        {"audio": torch.zeros(B, 1, 64, 11), "events": torch.zeros(B, 100, 3)},  # cached log-mel features
        {"image": torch.zeros(B, 3, 8, 8), "mask": torch.zeros(B, 1, 8, 8)},  # segmentation: no label
        {"image": torch.zeros(B, 3, 8, 8), "label": torch.arange(B, dtype=torch.int32)},  # any integer dtype
        # keys the contract does not know are the dataset's own
        {**AUDIO, "path": ["a"] * 3, "clip_seconds": torch.ones(1), "sr": 16000, "meta": {"x": 1}},
    ],
)
def test_valid_batches_pass(batch):
    check_batch(batch, where=WHERE)


CASES = [
    (
        {**AUDIO, "labels": torch.arange(B)},
        "'labels' is int64 [4]; 'labels' means multi-hot float [B, K]; for class indices use 'label'",
    ),
    ({**AUDIO, "labels": torch.zeros(B)}, "'labels' is float32 [4]; 'labels' means multi-hot float [B, K]"),
    (
        {**AUDIO, "labels": torch.zeros(B, 5, dtype=torch.long)},
        "'labels' is int64 [4, 5]; it must be multi-hot float [B, K]: convert it with .float()",
    ),
    (
        {**AUDIO, "label": torch.zeros(B, 5)},
        "'label' is float32 [4, 5]; 'label' means class indices int64 [B]; "
        "for multi-hot float [B, K] targets use 'labels'",
    ),
    (
        {**AUDIO, "label": torch.zeros(B)},
        "'label' is float32 [4]; it must be class indices int64 [B]: convert it with .long()",
    ),
    (
        {**AUDIO, "label": torch.zeros(B, 1, dtype=torch.long)},
        "'label' is int64 [4, 1]; it must be class indices int64 [B]: return a scalar class index per sample",
    ),
    (
        {"image": torch.zeros(B, 8, 8, 3)},
        "'image' is float32 [4, 8, 8, 3]; it must be RGB float [B, 3, H, W] and looks channels-last",
    ),
    (
        {"image": torch.zeros(B, 1, 8, 8)},
        "'image' is float32 [4, 1, 8, 8]; it must be RGB float [B, 3, H, W]: convert the images to RGB",
    ),
    (
        {"image": torch.zeros(B, 3, 8, 8, dtype=torch.uint8)},
        "'image' is uint8 [4, 3, 8, 8]; it must be RGB float [B, 3, H, W]: scale the pixels to floats",
    ),
    (
        {"image": torch.zeros(B, 3, 8)},
        "'image' is float32 [4, 3, 8]; it must be RGB float [B, 3, H, W]: return one float [3, H, W] tensor per sample",
    ),
    (
        {"audio": torch.zeros(B, 160, dtype=torch.int16)},
        "'audio' is int16 [4, 160]; it must be a float waveform "
        "[B, C, S] (or [B, S]) or float features [B, 1, M, T]: convert integer PCM to floats",
    ),
    ({"audio": torch.zeros(B, 2, 64, 11)}, "'audio' is float32 [4, 2, 64, 11]; it must be a float waveform"),
    ({"audio": torch.zeros(B)}, "'audio' is float32 [4]; it must be a float waveform"),
    (
        {**AUDIO, "mask": torch.zeros(B, 8, 8)},
        "'mask' is float32 [4, 8, 8]; it must be a float shadow mask [B, 1, h, w] in [0, 1]: add the channel dimension",
    ),
    (
        {**AUDIO, "mask": torch.zeros(B, 1, 8, 8, dtype=torch.uint8)},
        "'mask' is uint8 [4, 1, 8, 8]; it must be a float shadow mask [B, 1, h, w] in [0, 1]: convert it to floats",
    ),
    (
        {**AUDIO, "events": torch.zeros(B, 100, 3, dtype=torch.bool)},
        "'events' is bool [4, 100, 3]; it must be float frame targets [B, T, K]: convert it with .float()",
    ),
    ({**AUDIO, "events": torch.zeros(B, 100)}, "'events' is float32 [4, 100]; it must be float frame targets"),
    (
        {**AUDIO, "index": ["a", "b", "c", "d"]},
        "'index' is a list, not a tensor; it must be the dataset row indices int64 [B]",
    ),
    ({**AUDIO, "label": [0, 1, 0, 1]}, "'label' is a list, not a tensor"),
]


@pytest.mark.parametrize(("batch", "message"), CASES)
def test_each_mistake_gets_its_message(batch, message):
    with pytest.raises(BatchFormatError) as caught:
        check_batch(batch, where=WHERE)
    assert str(caught.value).startswith(f"{WHERE}'s {message}"), str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_batch_without_input_keys_names_the_keys_it_has():
    with pytest.raises(BatchFormatError) as caught:
        check_batch({"images": torch.zeros(B, 3, 8, 8), "sound": torch.zeros(B, 1, 160)}, where=WHERE)
    assert str(caught.value) == (
        "the first training batch has no 'image' or 'audio' key (keys: images, sound): rename them in your "
        "dataset, or, if your module reads other keys, name them in its input_keys "
        "(e.g. input_keys = ('images', 'sound'))"
    )
    check_batch({"images": torch.zeros(B, 3, 8, 8)}, input_keys=("images",))  # a module that reads 'images'
    with pytest.raises(BatchFormatError, match="has no 'spectrogram' key"):
        check_batch({"image": torch.zeros(B, 3, 8, 8)}, input_keys=("spectrogram",))


def test_keys_must_agree_on_the_batch_size():
    with pytest.raises(BatchFormatError, match=r"keys disagree on the batch size \('audio' 4, 'label' 3\)"):
        check_batch({**AUDIO, "label": torch.arange(3)}, where=WHERE)


def test_a_batch_must_be_a_dict_unless_the_module_takes_another_format():
    with pytest.raises(BatchFormatError, match=r"^the first training batch is a tuple, not a dict of named tensors"):
        check_batch((torch.zeros(B, 3, 8, 8), torch.arange(B)), where=WHERE)
    check_batch((torch.zeros(B, 3, 8, 8), torch.arange(B)), input_keys=None)  # input_keys = None: no checks


def test_the_check_reads_no_values_and_draws_no_random_numbers():
    state = torch.get_rng_state()
    meta = {"image": torch.empty(B, 3, 8, 8, device="meta"), "label": torch.empty(B, dtype=torch.long, device="meta")}
    check_batch(meta)  # meta tensors have shapes and dtypes but no data: reading a value would raise
    assert torch.equal(torch.get_rng_state(), state)


def test_every_rule_is_in_the_batch_table_of_the_data_docs():
    doc = (Path(__file__).parents[2] / "docs" / "data.md").read_text()
    section = doc.split("\n## The batch\n", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"^\| `(\w+)` (?:\(cache\) )?\|", section, flags=re.M))
    assert {rule.key for rule in BATCH_KEYS} == documented
