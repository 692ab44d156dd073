"""What tensor parallelism refuses, before any process starts: no plan, heads that do not split, int8."""

import pytest
from transformers import GPT2Config, LlamaConfig

from radixlm.config import ParallelConfig
from radixlm.model.sharding import check_tensor_parallel, local_kv_heads, plan_override
from radixlm.worker.tensor_parallel.group import node_ranks, rendezvous


def llama(heads: int, kv_heads: int) -> LlamaConfig:
    return LlamaConfig(hidden_size=16 * heads, num_attention_heads=heads, num_key_value_heads=kv_heads,
                       architectures=["LlamaForCausalLM"])


def test_an_architecture_without_a_plan_is_named():
    with pytest.raises(ValueError, match="gpt2 has no tensor-parallel plan"):
        check_tensor_parallel(GPT2Config(), 2, None)


def test_head_counts_that_do_not_split_are_refused_with_the_sizes_that_work():
    with pytest.raises(ValueError, match=r"must divide .*'s 4 attention heads.* 2 KV heads.* sizes that work: "
                                         r"\[1, 2, 4\]"):
        check_tensor_parallel(llama(4, 2), 3, None)
    with pytest.raises(ValueError, match=r"9 attention heads.* 3 KV heads.* \[1, 3, 9\]"):  # SmolLM2-135M
        check_tensor_parallel(llama(9, 3), 2, None)


def test_more_ranks_than_kv_heads_replicate_them():
    check_tensor_parallel(llama(8, 2), 4, None)
    assert plan_override(llama(8, 2), 4) == {"model.layers.*.self_attn.k_proj": "replicate",
                                             "model.layers.*.self_attn.v_proj": "replicate"}
    assert plan_override(llama(8, 4), 4) is None
    assert local_kv_heads(llama(8, 2), 4) == 1


def test_int8_with_tensor_parallelism_is_refused():
    with pytest.raises(ValueError, match="quantization int8"):
        check_tensor_parallel(llama(4, 2), 2, "int8")


def test_each_rank_caches_its_share_of_the_kv_heads():
    check_tensor_parallel(llama(8, 4), 4, None)
    assert local_kv_heads(llama(8, 4), 4) == 1
    assert local_kv_heads(llama(8, 4), 1) == 4


def test_nodes_split_the_ranks_in_order():
    assert list(node_ranks(4, 2, 0)) == [0, 1]
    assert list(node_ranks(4, 2, 1)) == [2, 3]
    assert rendezvous("10.0.0.1:29500") == ("10.0.0.1", 29500)
    assert rendezvous(None)[0] == "127.0.0.1"


def test_one_rendezvous_address_cannot_serve_several_replicas():
    with pytest.raises(ValueError, match="dist_init_addr is for one tensor-parallel group"):
        ParallelConfig(tensor_parallel_size=2, data_parallel_size=2, dist_init_addr="127.0.0.1:29500")
    ParallelConfig(tensor_parallel_size=2, data_parallel_size=2)
