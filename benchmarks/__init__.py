"""Investigations outside the package: one script each, run from the checkout's root as
`.venv/bin/python benchmarks/NAME.py [flags]` or `.venv/bin/python -m benchmarks.NAME [flags]` (see README.md here).
They import `radixlm` like any user code; nothing in `radixlm` imports them."""
