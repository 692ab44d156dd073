"""Speculative decoding: drafts proposed on the engine's side, verified by the worker in the batch (see
`core/step.py`: a chunk ending with drafts samples one row per position)."""
