"""Pure-Python engine core: block pool, KV cache manager, radix cache and scheduler. No torch imports here."""
