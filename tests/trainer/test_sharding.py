"""``trainer.fsdp`` / ``trainer.deepspeed`` translated to Accelerate's plugins.

Checked on the CPU: the translation and the built plugins. Sharding itself needs GPUs.
"""

from __future__ import annotations

import importlib.util

import pytest

from sss.config import ConfigError
from sss.config.sharding import check_sharding, deepspeed_kwargs, describe, fsdp_kwargs
from sss.trainer.sharding import accelerator_plugins


def test_fsdp2_defaults_build_the_plugin():
    from torch.distributed.fsdp import CPUOffloadPolicy, StateDictType

    plugin = accelerator_plugins({"cpu_offload": True, "activation_checkpointing": True}, None)["fsdp_plugin"]
    assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is True
    assert plugin.state_dict_type == StateDictType.SHARDED_STATE_DICT  # resumable checkpoints, written shard by shard
    assert isinstance(plugin.cpu_offload, CPUOffloadPolicy) and plugin.activation_checkpointing
    assert plugin.auto_wrap_policy is None  # no_wrap
    shard_grad_op = accelerator_plugins({"sharding_strategy": "shard_grad_op"}, None)["fsdp_plugin"]
    assert shard_grad_op.reshard_after_forward is False


def test_fsdp1_plugin_keeps_the_strategy_and_the_original_parameters():
    from torch.distributed.fsdp import BackwardPrefetch, ShardingStrategy, StateDictType
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    fsdp = {
        "fsdp_version": 1,
        "sharding_strategy": "HYBRID_SHARD",
        "auto_wrap_policy": "transformer_based_wrap",
        "transformer_cls_names_to_wrap": ["Block"],
        "backward_prefetch": "BACKWARD_PRE",
        "state_dict_type": "full_state_dict",
    }
    plugin = accelerator_plugins(fsdp, None)["fsdp_plugin"]
    assert plugin.sharding_strategy == ShardingStrategy.HYBRID_SHARD  # what Accelerate hands to FSDP(...)
    assert plugin.use_orig_params is True  # the optimizer sss built before the wrap keeps training the model
    assert plugin.auto_wrap_policy is transformer_auto_wrap_policy and plugin.transformer_cls_names_to_wrap == ["Block"]
    assert plugin.backward_prefetch == BackwardPrefetch.BACKWARD_PRE
    assert plugin.state_dict_type == StateDictType.FULL_STATE_DICT


def test_size_based_wrap_gets_torchs_default_threshold():
    assert fsdp_kwargs({"auto_wrap_policy": "size_based_wrap"})["min_num_params"] == 10**8
    plugin = accelerator_plugins({"auto_wrap_policy": "size_based_wrap", "min_num_params": 1000}, None)["fsdp_plugin"]
    assert plugin.min_num_params == 1000


@pytest.mark.parametrize(
    ("fsdp", "message"),
    [
        (
            {"sharding": "FULL_SHARD"},
            r"trainer\.fsdp\.sharding: unknown key; valid keys: fsdp_version, sharding_strategy",
        ),
        ({"sharding_strategy": "FULL"}, r"trainer\.fsdp\.sharding_strategy: 'FULL' is not valid; valid: FULL_SHARD, "),
        ({"sharding_strategy": "HYBRID_SHARD"}, r"sharding_strategy.*FULL_SHARD, SHARD_GRAD_OP \(fsdp_version 2\)"),
        ({"fsdp_version": 3}, r"trainer\.fsdp\.fsdp_version: 3 is not valid; valid: 1, 2"),
        ({"fsdp_version": "2"}, r"trainer\.fsdp\.fsdp_version: '2'"),
        ({"cpu_offload": "yes"}, r"trainer\.fsdp\.cpu_offload: 'yes' is not valid; valid: true or false"),
        ({"state_dict_type": "LOCAL_STATE_DICT"}, r"valid: SHARDED_STATE_DICT, FULL_STATE_DICT"),
        ({"auto_wrap_policy": "transformer_based_wrap"}, r"trainer\.fsdp\.transformer_cls_names_to_wrap"),
        ({"transformer_cls_names_to_wrap": ["Block"]}, r"given exactly when auto_wrap_policy is transformer_based"),
        ({"min_num_params": 10}, r"trainer\.fsdp\.min_num_params: 10 .*only with auto_wrap_policy size_based_wrap"),
        ({"auto_wrap_policy": "size_based_wrap", "min_num_params": True}, r"min_num_params: True .*an integer"),
        ({"backward_prefetch": "BACKWARD_PRE"}, r"trainer\.fsdp\.backward_prefetch.*only with fsdp_version 1"),
        ({"use_orig_params": False}, r"trainer\.fsdp\.use_orig_params is not an sss setting: always true"),
        ({"mixed_precision_policy": "bf16"}, r"set trainer\.mixed_precision"),
        (["FULL_SHARD"], r"trainer\.fsdp must be a mapping"),
    ],
)
def test_bad_fsdp_settings_name_the_key_and_the_choices(fsdp, message):
    with pytest.raises(ConfigError, match=message):
        accelerator_plugins(fsdp, None)


def test_deepspeed_translation_and_the_plugin_it_builds_on_the_cpu():
    from accelerate.utils import DeepSpeedPlugin

    kwargs = deepspeed_kwargs(
        {
            "zero_stage": 3,
            "offload_optimizer_device": "nvme",
            "offload_optimizer_nvme_path": "/nvme",
            "offload_param_device": "cpu",
        },
        max_grad_norm=0.5,
    )
    assert kwargs == {
        "zero_stage": 3,
        "gradient_clipping": 0.5,  # trainer.max_grad_norm: DeepSpeed clips inside its step
        "zero3_init_flag": False,
        "zero3_save_16bit_model": True,
        "offload_optimizer_device": "nvme",
        "offload_optimizer_nvme_path": "/nvme",
        "offload_param_device": "cpu",
    }
    # The plugin itself builds without the deepspeed package; the Accelerator that uses it does not.
    zero = DeepSpeedPlugin(**kwargs).deepspeed_config["zero_optimization"]
    assert zero["stage"] == 3 and zero["offload_param"]["device"] == "cpu"
    assert zero["offload_optimizer"] == {"device": "nvme", "nvme_path": "/nvme"}
    assert zero["stage3_gather_16bit_weights_on_model_save"] is True
    no_clip = deepspeed_kwargs({}, max_grad_norm=None)
    assert no_clip["zero_stage"] == 2 and no_clip["gradient_clipping"] == 0.0
    # 0 is DeepSpeed's own default, "no clipping": Accelerate >= 1.16 writes it into the config, earlier
    # versions left the key out; either way the engine must not clip (and must not read "auto").
    assert DeepSpeedPlugin(**no_clip).deepspeed_config.get("gradient_clipping", 0.0) == 0.0


@pytest.mark.parametrize(
    ("deepspeed", "message"),
    [
        ({"zero_stage": 4}, r"trainer\.deepspeed\.zero_stage: 4 is not valid; valid: 0, 1, 2, 3"),
        ({"stage": 2}, r"trainer\.deepspeed\.stage: unknown key; valid keys: zero_stage, offload_optimizer_device"),
        ({"zero_stage": 1, "offload_optimizer_device": "cpu"}, r"offload_optimizer_device.*none below zero_stage 2"),
        ({"zero_stage": 2, "offload_param_device": "cpu"}, r"offload_param_device.*none below zero_stage 3"),
        ({"offload_optimizer_device": "gpu"}, r"'gpu' is not valid; valid: none, cpu, nvme"),
        ({"offload_optimizer_device": "nvme"}, r"trainer\.deepspeed\.offload_optimizer_nvme_path: None"),
        (
            {"gradient_clipping": 1.0},
            r"trainer\.deepspeed\.gradient_clipping is not an sss setting: set trainer\.max_grad",
        ),
        ({"zero3_init_flag": True}, r"deepspeed\.zero\.Init"),
    ],
)
def test_bad_deepspeed_settings_name_the_key_and_the_choices(deepspeed, message):
    with pytest.raises(ConfigError, match=message):
        check_sharding(None, deepspeed)


def test_one_of_fsdp_and_deepspeed_and_nothing_on_the_cpu():
    assert accelerator_plugins(None, None) == {}
    with pytest.raises(ConfigError, match=r"trainer\.fsdp and trainer\.deepspeed are both set"):
        accelerator_plugins({}, {})
    with pytest.warns(UserWarning, match=r"trainer\.fsdp is ignored on the CPU \(FSDP2 FULL_SHARD.*needs CUDA GPUs"):
        assert accelerator_plugins({}, None, cpu=True) == {}
    with pytest.raises(ConfigError, match="zero_stage"):  # checked even where it would be ignored
        accelerator_plugins(None, {"zero_stage": 5}, cpu=True)


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is not None, reason="deepspeed is installed")
def test_deepspeed_without_the_package_says_what_to_install():
    with pytest.raises(ImportError, match=r"pip install deepspeed \(DeepSpeed needs CUDA GPUs\)"):
        accelerator_plugins(None, {"zero_stage": 2})


def test_describe_names_what_shards_and_what_it_needs():
    assert describe(None, None) == "DDP (no sharding)"
    assert "FSDP1 NO_SHARD" in describe({"fsdp_version": 1, "sharding_strategy": "no_shard"}, None)
    assert describe(None, {}).startswith("DeepSpeed ZeRO-2, offload optimizer none, params none: needs CUDA GPUs")
