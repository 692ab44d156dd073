"""Tensor parallelism over torch.distributed: the process group (`group.py`), one rank's loop (`rank.py`) and the
executor the engine talks to (`executor.py`)."""
