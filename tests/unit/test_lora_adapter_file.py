"""A bad LoRA adapter is refused from its config and safetensors header with one line naming the file and the
field, before any tensor is read; a good one is read with PEFT's scaling."""

from __future__ import annotations

import json
import math
import struct

import pytest
import torch
from safetensors.torch import save_file

from radixlm.model.lora.adapter_file import AdapterError, read_adapter

SHAPES = {"model.layers.0.self_attn.q_proj": (8, 8), "model.layers.0.mlp.down_proj": (16, 8)}
PREFIX = "base_model.model."


def write_adapter(directory, config=None, tensors=None):
    directory.mkdir(exist_ok=True)
    (directory / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": 2, "lora_alpha": 4, **(config or {})}))
    if tensors is None:
        tensors = {f"{PREFIX}model.layers.0.self_attn.q_proj.lora_A.weight": torch.zeros(2, 8),
                   f"{PREFIX}model.layers.0.self_attn.q_proj.lora_B.weight": torch.zeros(8, 2)}
    save_file(tensors, directory / "adapter_model.safetensors")
    return directory


def test_a_good_adapter_reads_with_peft_scaling(tmp_path):
    adapter = read_adapter(write_adapter(tmp_path / "a"), SHAPES, max_rank=8)
    assert adapter.rank == 2 and [m.name for m in adapter.modules] == ["model.layers.0.self_attn.q_proj"]
    assert adapter.modules[0].scaling == 2.0
    rs = read_adapter(write_adapter(tmp_path / "b", {"use_rslora": True}), SHAPES, max_rank=8)
    assert rs.modules[0].scaling == pytest.approx(4 / math.sqrt(2))
    patterned = read_adapter(write_adapter(tmp_path / "c", {"alpha_pattern": {"q_proj": 8}}), SHAPES, max_rank=8)
    assert patterned.modules[0].scaling == 4.0


@pytest.mark.parametrize(("config", "field"), [
    ({"r": 0}, "r"), ({"r": 99}, "r"), ({"r": "2"}, "r"), ({"lora_alpha": float("nan")}, "lora_alpha"),
    ({"peft_type": "IA3"}, "peft_type"), ({"use_dora": True}, "use_dora"), ({"bias": "all"}, "bias"),
    ({"modules_to_save": ["lm_head"]}, "modules_to_save"), ({"fan_in_fan_out": True}, "fan_in_fan_out"),
    ({"rank_pattern": {"q_proj": 64}}, "rank_pattern"), ({"alpha_pattern": {"(": 1}}, "alpha_pattern"),
])
def test_bad_configs_are_refused_naming_the_field(tmp_path, config, field):
    with pytest.raises(AdapterError, match=f"adapter_config.json: {field}") as error:
        read_adapter(write_adapter(tmp_path / "a", config), SHAPES, max_rank=8)
    assert error.value.field == field


def test_bad_tensors_are_refused_naming_the_key(tmp_path):
    a_key = f"{PREFIX}model.layers.0.self_attn.q_proj.lora_A.weight"
    b_key = f"{PREFIX}model.layers.0.self_attn.q_proj.lora_B.weight"
    cases = [
        ({a_key: torch.zeros(2, 8)}, "has no lora_B"),
        ({a_key: torch.zeros(2, 7), b_key: torch.zeros(8, 2)}, "shape must be \\[2, 8\\]"),
        ({a_key: torch.zeros(2, 8, dtype=torch.int32), b_key: torch.zeros(8, 2)}, "dtype"),
        ({f"{PREFIX}model.embed_tokens.lora_embedding_A": torch.zeros(2, 8)}, "not a LoRA weight"),
        ({f"{PREFIX}lm_head.lora_A.weight": torch.zeros(2, 8), f"{PREFIX}lm_head.lora_B.weight": torch.zeros(8, 2)},
         "not an attention or MLP projection"),
        ({}, "holds no LoRA weights"),
    ]
    for i, (tensors, message) in enumerate(cases):
        with pytest.raises(AdapterError, match=message):
            read_adapter(write_adapter(tmp_path / f"case{i}", tensors=tensors), SHAPES, max_rank=8)


def test_missing_truncated_and_corrupt_files_are_refused(tmp_path):
    with pytest.raises(AdapterError, match="is not a directory"):
        read_adapter(tmp_path / "nowhere", SHAPES, max_rank=8)
    with pytest.raises(AdapterError, match="NUL"):
        read_adapter(f"{tmp_path}/a\x00b", SHAPES, max_rank=8)
    directory = write_adapter(tmp_path / "a")
    weights = directory / "adapter_model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:-10])
    with pytest.raises(AdapterError, match="outside the file"):
        read_adapter(directory, SHAPES, max_rank=8)
    weights.write_bytes(struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(AdapterError, match="bad header length"):
        read_adapter(directory, SHAPES, max_rank=8)
    (directory / "adapter_config.json").write_text("[1, 2")
    with pytest.raises(AdapterError, match="is not JSON"):
        read_adapter(directory, SHAPES, max_rank=8)
    (directory / "adapter_config.json").unlink()
    with pytest.raises(AdapterError, match="is missing"):
        read_adapter(directory, SHAPES, max_rank=8)
