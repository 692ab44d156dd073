"""One layer's paged decode attention for rows on a shared prefix (a prefix-cache hit: their tables begin with the
same blocks), where the kernel attends the shared positions once for every row (csrc/attention/decode_cascade.cpp),
against the same rows over private copies of those blocks (the same values; every row reads its own context, as the
kernel does without a shared part). Bfloat16 queries and cache. With --layers N each call attends the next of N
layers' caches in turn, as a forward does (30: each layer's K/V comes from memory, not from the last call's cache).

    .venv/bin/python benchmarks/decode_cascade.py [--rows 2,4,8,32] [--context 1056] [--shared-blocks 62] [--layers 30]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from radixlm.model.attention.cpp_backend import DecodeTables, paged_decode_attention
from radixlm.model.kv_cache import LayerCache

BLOCK_SIZE = 16


def median_ms(tables: list[list[int]], lengths: list[int], query: torch.Tensor, layers: list[LayerCache],
              repeats: int) -> tuple[float, torch.Tensor]:
    """The median ms of one call (each pass over the layers timed whole) and layer 0's output."""
    decode_tables = DecodeTables.build(tables, lengths, BLOCK_SIZE)
    scale = query.shape[-1] ** -0.5
    out = paged_decode_attention(query, layers[0], decode_tables, scale, None, None)
    times = []
    for _ in range(max(3, repeats // len(layers))):
        start = time.perf_counter()
        for layer in layers:
            paged_decode_attention(query, layer, decode_tables, scale, None, None)
        times.append((time.perf_counter() - start) / len(layers))
    return statistics.median(times) * 1e3, out


def compare(num_rows: int, context: int, shared_blocks: int, heads: tuple[int, int], head_dim: int,
            num_layers: int, repeats: int) -> None:
    num_heads, num_kv_heads = heads
    own_blocks = -(-context // BLOCK_SIZE) - shared_blocks
    prefix = list(range(shared_blocks))
    shared = [prefix + [shared_blocks + b * own_blocks + i for i in range(own_blocks)] for b in range(num_rows)]
    first_copy = shared_blocks + num_rows * own_blocks
    copies = [[first_copy + b * len(table) + i for i in range(len(table))] for b, table in enumerate(shared)]
    num_blocks = first_copy + num_rows * (shared_blocks + own_blocks)
    layers = []
    for _ in range(num_layers):
        caches = [torch.randn(num_blocks, BLOCK_SIZE, num_kv_heads, head_dim).bfloat16() for _ in "kv"]
        for cache in caches:
            for table, copy in zip(shared, copies, strict=True):
                cache[copy] = cache[table]
        layers.append(LayerCache(caches[0].flatten(0, 1), caches[1].flatten(0, 1), None, None))
    query = torch.randn(num_rows, num_heads, head_dim).bfloat16()
    lengths = [context] * num_rows
    together_ms, together = median_ms(shared, lengths, query, layers, repeats)
    apart_ms, apart = median_ms(copies, lengths, query, layers, repeats)
    difference = (together.float() - apart.float()).abs().max().item()
    print(f"| {num_rows} | {context} | {shared_blocks * BLOCK_SIZE} | {apart_ms:.3f} | {together_ms:.3f} | "
          f"{apart_ms / together_ms:.2f}x | {difference:.4f} |")


MAX_ROWS = 1024
MAX_CACHE_BYTES = 8 << 30  # every layer's caches, copies included


def parse_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[list[int], tuple[int, int]]:
    """The row counts and (query heads, KV heads), every argument checked (parser.error names the bad one)."""
    try:
        row_counts = [int(n) for n in args.rows.split(",")]
        num_heads, num_kv_heads = (int(n) for n in args.heads.split("/"))
    except ValueError:
        parser.error("--rows takes comma-separated integers and --heads QUERY/KV integers")
    if not all(1 <= n <= MAX_ROWS for n in row_counts):
        parser.error(f"--rows must each be in [1, {MAX_ROWS}]")
    if num_kv_heads < 1 or num_heads < num_kv_heads or num_heads % num_kv_heads:
        parser.error("--heads: query heads must be a positive multiple of the KV heads")
    if args.head_dim < 16 or args.head_dim > 512 or args.head_dim % 16:
        parser.error("--head-dim must be a multiple of 16 in [16, 512]")
    if not 1 <= args.layers <= 256 or args.repeats < 1:
        parser.error("--layers must be in [1, 256] and --repeats at least 1")
    if args.shared_blocks < 0 or not args.shared_blocks * BLOCK_SIZE < args.context <= 1 << 20:
        parser.error("--shared-blocks must leave each row positions of its own (and --context at most 2^20)")
    blocks = -(-args.context // BLOCK_SIZE)
    cache_bytes = args.layers * 2 * (blocks + max(row_counts) * blocks) * BLOCK_SIZE * num_kv_heads * args.head_dim * 2
    if cache_bytes > MAX_CACHE_BYTES:
        parser.error(f"the caches would take {cache_bytes / 2**30:.1f} GiB (at most {MAX_CACHE_BYTES >> 30})")
    return row_counts, (num_heads, num_kv_heads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="2,4,8,32", help="comma-separated row counts")
    parser.add_argument("--context", type=int, default=1056, help="every row's context length")
    parser.add_argument("--shared-blocks", type=int, default=62, help="blocks of 16 positions the rows share")
    parser.add_argument("--heads", default="9/3", help="query heads / KV heads")
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--layers", type=int, default=1, help="layers' caches attended in turn (30: cold caches)")
    parser.add_argument("--repeats", type=int, default=60, help="calls timed, over all layers")
    args = parser.parse_args()
    row_counts, heads = parse_arguments(parser, args)
    print(f"torch threads {torch.get_num_threads()}; ms per call (median), {args.layers} layers in turn")
    print("| rows | context | shared | apart ms | together ms | speed-up | max abs difference |")
    print("|---|---|---|---|---|---|---|")
    for num_rows in row_counts:
        compare(num_rows, args.context, args.shared_blocks, heads, args.head_dim, args.layers, args.repeats)


if __name__ == "__main__":
    main()
