"""`--api-key`'s check, in a module that imports nothing heavy: `radixlm serve` runs it before torch loads."""

from __future__ import annotations


def check_api_key(api_key: str) -> None:
    """Raise ValueError (naming --api-key) for a key no client could send: empty or blank (which would read as
    "no key" and turn auth off), with whitespace at either end (stripped from the header a client sends), or with
    anything but printable ASCII (HTTP header values cannot carry it)."""
    if not api_key.strip():
        raise ValueError("--api-key (or $RADIXLM_API_KEY) is empty; give a key, or omit it to serve without one")
    if api_key != api_key.strip():
        raise ValueError("--api-key (or $RADIXLM_API_KEY) starts or ends with whitespace, which clients' headers "
                         "cannot carry")
    if not (api_key.isascii() and api_key.isprintable()):
        raise ValueError("--api-key (or $RADIXLM_API_KEY) must be printable ASCII (HTTP headers carry nothing else)")
