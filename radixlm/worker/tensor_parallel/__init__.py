"""Tensor parallelism, below the engine: the worker the engine talks to is an executor (`executor.py`) driving one
process per rank (`rank.py`) in a torch.distributed group (`group.py`); the model's collectives are the model's
(`radixlm/model/collectives.py`). Data parallelism, above the engine, is `radixlm/data_parallel/`."""
