"""ParallelConfig and --device: bad values are ValueErrors naming the field."""

import pytest

from radixlm.config import EngineConfig


@pytest.mark.parametrize(("options", "field"), [
    ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
    ({"data_parallel_size": 65}, "data_parallel_size"),
    ({"tensor_parallel_size": True}, "tensor_parallel_size"),
    ({"nnodes": 2, "tensor_parallel_size": 2}, "dist_init_addr"),
    ({"nnodes": 2, "tensor_parallel_size": 3, "dist_init_addr": "h:1"}, "tensor_parallel_size"),
    ({"node_rank": 1}, "node_rank"),
    ({"dist_init_addr": "nohost"}, "dist_init_addr"),
    ({"dist_init_addr": "h:99999"}, "dist_init_addr"),
    ({"device": "tpu"}, "device"),
    ({"node_rank": "x"}, "node_rank"),
    ({"dist_init_addr": 123}, "dist_init_addr"),
    ({"dist_init_addr": "\ud800:1"}, "dist_init_addr"),
    ({"data_parallel_size": float("nan")}, "data_parallel_size"),
])
def test_bad_parallel_options_name_their_field(options: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        EngineConfig.from_kwargs(**options)


def test_parallel_defaults_are_one_process() -> None:
    config = EngineConfig.from_kwargs(tensor_parallel_size=2, nnodes=2, node_rank=1, dist_init_addr="10.0.0.1:29500")
    assert config.parallel.tensor_parallel_size == 2 and config.parallel.node_rank == 1
    assert EngineConfig().parallel.data_parallel_size == 1 and EngineConfig().model.device == "auto"


def test_prompts_per_request_limit_names_the_flag_that_sets_it() -> None:
    with pytest.raises(ValueError, match="max_prompts_per_request"):
        EngineConfig.from_kwargs(max_prompts_per_request=0)
    assert EngineConfig.from_kwargs().scheduler.prompts_per_request_limit == (64, "--max-prompts-per-request")
    queued = EngineConfig.from_kwargs(max_queued_requests=8).scheduler.prompts_per_request_limit
    assert queued == (8, "--max-queued-requests")
