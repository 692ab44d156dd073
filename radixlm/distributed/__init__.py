"""Beyond one worker process. Data parallelism: engine replicas behind a cache-aware router (`data_parallel.py`,
`router.py`, `offline.py`). Tensor parallelism over torch.distributed: the process group (`group.py`), one rank's
loop (`rank.py`) and the executor the engine talks to (`executor.py`)."""
