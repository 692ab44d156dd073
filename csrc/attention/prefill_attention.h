// Causal attention for prefill chunks in bfloat16 on AVX-512 BF16 or AMX-BF16 (prefill_attention.cpp), for its
// dispatcher registration in csrc/bindings.cpp. radixlm/model/attention/prefill_kernel.py chooses it and holds its
// reference (PyTorch's SDPA).
#pragma once

#include <ATen/ATen.h>

namespace radixlm {

// Whether this CPU runs the kernel: AVX-512 F/BW/VL/DQ with the BF16 dot product (asked once).
bool prefill_attention_available();

// out[t, h] = softmax_j(scale * q[t, h] . k[j, h / rep]) v[j, h / rep] over the keys a query may see: query t sits
// at position L - T + t of its context of L keys (the chunk is the context's last T positions), and sees keys
// 0..its position, only the last `sliding_window` of them when that is > 0. softcap > 0 caps the logits as
// tanh(x / softcap) * softcap. query and out [T, Hq, D], key and value [L, Hkv, D], all bfloat16 with D contiguous
// (any other strides), Hq a multiple of Hkv, D a multiple of 16 up to 512, L >= T. Float32 arithmetic but for the
// probabilities, rounded to bfloat16 for their product with V (as PyTorch's bfloat16 SDPA does). `tiles`: the two
// products on AMX-BF16 tiles (needs amx_bf16_available() and D a multiple of 32), else AVX-512's dot product.
void prefill_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value, at::Tensor& out,
                       double scale, int64_t sliding_window, double softcap, bool tiles);

// prefill_attention for every prefill chunk of a step in one call, K/V read from a layer's paged caches
// ([num_slots, Hkv, D] bfloat16, slot = block * block_size + offset). Chunk i is segments[i] = (first_row,
// num_queries, context_len, table_offset): query and out rows first_row .. first_row + num_queries - 1 are the last
// positions of a context of context_len keys whose blocks are block_table[table_offset:] (int32). The chunks' rows
// must not overlap. Each row gets exactly the numbers prefill_attention gives it over its context's K/V.
void prefill_attention_paged(const at::Tensor& query, const at::Tensor& key_cache, const at::Tensor& value_cache,
                             at::Tensor& out, const at::Tensor& block_table, const at::Tensor& segments,
                             int64_t block_size, double scale, int64_t sliding_window, double softcap,
                             bool tiles);

}  // namespace radixlm
