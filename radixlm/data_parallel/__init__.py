"""Data parallelism: engine replicas behind one router, above the engine (`engine.py` for the server, `offline.py` for
`LLM`); tensor parallelism, below the engine, is the worker's (`radixlm/worker/tensor_parallel/`)."""
