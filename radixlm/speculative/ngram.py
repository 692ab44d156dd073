"""n-gram drafts ("prompt lookup decoding"): continue the sequence the way it went the last time its ending
n-gram appeared in it."""

from __future__ import annotations

from array import array

_ITEM = array("i").itemsize


def find_draft(token_ids: list[int], max_tokens: int, lookup_max: int, lookup_min: int) -> list[int]:
    """Up to `max_tokens` tokens that followed the most recent earlier occurrence of the longest n-gram (n from
    `lookup_max` down to `lookup_min`) that ends `token_ids`; empty when there is none.

    The search runs in C: the tokens as one bytes string, `rfind` of the n-gram's bytes, keeping only matches at
    token boundaries.
    """
    length = len(token_ids)
    if max_tokens <= 0 or length <= lookup_min:
        return []
    data = array("i", token_ids).tobytes()
    for n in range(min(lookup_max, length - 1), lookup_min - 1, -1):
        pattern = data[-n * _ITEM:]
        end = (length - 1) * _ITEM  # an occurrence must end before the last token
        while (found := data.rfind(pattern, 0, end)) != -1 and found % _ITEM:
            end = found + len(pattern) - 1
        if found != -1:
            start = found // _ITEM + n
            return token_ids[start:start + max_tokens]
    return []
