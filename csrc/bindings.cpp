// The extension's one bindings file (in both of its builds, radixlm._C and radixlm._C_avx512): every op is
// registered here, nowhere else.
//
// - The dispatcher ops, torch.ops.radixlm.* (schemas and CPU kernels below): what torch.compile and autograd-aware
//   callers use, and the reference the tests hold the direct entry points to. radixlm/model/ops.py registers a fake
//   kernel for each, so a compiled graph treats them as opaque.
// - The module's own Python functions (the direct entry points): the same kernels with the arguments unpacked here
//   (python_args.h). A decode step at batch 1 makes about 120 linear calls of 10-30 microseconds each and 61 norms
//   of a few, and a call through torch.ops parses its arguments against the schema and boxes them, about 1-2
//   microseconds. These release the GIL around the kernel, as torch.ops does.
//
// A new kernel adds its header's include, its schema and impl lines, and (if eager callers need it) a direct entry.

#include <Python.h>
#include <torch/csrc/autograd/python_variable.h>
#include <torch/library.h>

#include <array>
#include <vector>

#include "activation/silu_and_mul.h"
#include "attention/kv_write.h"
#include "attention/paged_attention.h"
#include "attention/prefill_attention.h"
#include "layers/decode_layers_python.h"
#include "linear/amx_bf16.h"
#include "linear/bf16_dot.h"
#include "linear/bf16_packed.h"
#include "linear/linear.h"
#include "linear/linear_gguf.h"
#include "norm/rms_norm.h"
#include "norm/rotary.h"
#include "python_args.h"
#include "sample/greedy_tokens.h"

TORCH_LIBRARY(radixlm, m) {
  // attention/
  m.def("paged_decode_attention(Tensor query, Tensor(a!) key_cache, Tensor(b!) value_cache, Tensor block_table, "
        "Tensor block_offsets, Tensor context_lens, int block_size, float scale, int sliding_window, "
        "float softcap, Tensor? slot_mapping=None, Tensor? new_keys=None, Tensor? new_values=None, "
        "Tensor(c!)? key_scales=None, Tensor(d!)? value_scales=None) -> Tensor");
  m.def("prefill_attention(Tensor query, Tensor key, Tensor value, Tensor(a!) out, float scale, int sliding_window, "
        "float softcap, bool tiles=False) -> ()");
  m.def("prefill_attention_paged(Tensor query, Tensor key_cache, Tensor value_cache, Tensor(a!) out, "
        "Tensor block_table, Tensor segments, int block_size, float scale, int sliding_window, float softcap, "
        "bool tiles=False) -> ()");
  m.def("write_kv(Tensor(a!) key_cache, Tensor(b!) value_cache, Tensor slot_mapping, Tensor keys, Tensor values, "
        "Tensor(c!)? key_scales=None, Tensor(d!)? value_scales=None) -> ()");
  // linear/
  m.def("small_batch_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
  m.def("small_batch_int8_linear(Tensor x, Tensor weight, Tensor weight_scales, Tensor weight_sums, Tensor? bias) "
        "-> Tensor");
  m.def("int8_normalize_rows(Tensor x, Tensor(a!) row_max) -> Tensor");
  m.def("int8_rescale_rows_(Tensor(a!) out, Tensor row_max, Tensor? bias) -> ()");
  m.def("amx_bf16_linear(Tensor x, Tensor weight, Tensor? bias, Tensor? residual=None) -> Tensor");
  m.def("amx_bf16_gated_linear(Tensor x, Tensor weight) -> Tensor");
  m.def("bf16_dot_linear(Tensor x, Tensor weight, Tensor? bias) -> Tensor");
  m.def("bf16_packed_linear(Tensor x, Tensor packed, int out_features, Tensor? bias) -> Tensor");
  m.def("gguf_linear(Tensor x, Tensor[] tiles, int[] types, int[] out_features, Tensor? bias, int path=0) -> Tensor");
  m.def("gguf_rows(Tensor tiles, int type, int in_features, int out_features, Tensor ids) -> Tensor");
  m.def("gguf_pack_tiles(Tensor rows, int type, int in_features, Tensor(a!) out) -> ()");
  // norm/
  m.def("rms_norm(Tensor x, Tensor weight, float eps, bool pad_rows=False) -> Tensor");
  m.def("rotary(Tensor query_key, Tensor cos, Tensor sin) -> Tensor");
  // activation/
  m.def("silu_and_mul(Tensor gate_up, bool pad_rows=False, bool blocks16=False) -> Tensor");
  // sample/
  m.def("greedy_tokens(Tensor logits) -> Tensor");
}

TORCH_LIBRARY_IMPL(radixlm, CPU, m) {
  m.impl("paged_decode_attention", &radixlm::paged_decode_attention);
  m.impl("prefill_attention", &radixlm::prefill_attention);
  m.impl("prefill_attention_paged", &radixlm::prefill_attention_paged);
  m.impl("write_kv", &radixlm::write_kv);
  m.impl("small_batch_linear", &radixlm::small_batch_linear);
  m.impl("small_batch_int8_linear", &radixlm::small_batch_int8_linear);
  m.impl("int8_normalize_rows", &radixlm::int8_normalize_rows);
  m.impl("int8_rescale_rows_", &radixlm::int8_rescale_rows_);
  m.impl("amx_bf16_linear", &radixlm::amx_bf16_linear);
  m.impl("amx_bf16_gated_linear", &radixlm::amx_bf16_gated_linear);
  m.impl("bf16_dot_linear", &radixlm::bf16_dot_linear);
  m.impl("bf16_packed_linear", &radixlm::bf16_packed_linear);
  m.impl("gguf_linear", &radixlm::gguf_linear);
  m.impl("gguf_rows", &radixlm::gguf_rows);
  m.impl("gguf_pack_tiles", &radixlm::gguf_pack_tiles);
  m.impl("rms_norm", &radixlm::rms_norm);
  m.impl("rotary", &radixlm::rotary);
  m.impl("silu_and_mul", &radixlm::silu_and_mul);
  m.impl("greedy_tokens", &radixlm::greedy_tokens);
}

namespace {

using radixlm_python::call_kernel;
using radixlm_python::check_count;
using radixlm_python::int_arg;
using radixlm_python::ints_arg;
using radixlm_python::run_kernel;
using radixlm_python::tensor_arg;
using radixlm_python::tensors_arg;

PyObject* small_batch_linear(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  return call_kernel<3, true>("small_batch_linear", args, nargs, [](const auto& t) {
    return radixlm::small_batch_linear(*t[0], *t[1], t[2]);
  });
}

PyObject* small_batch_int8_linear(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  return call_kernel<5, true>("small_batch_int8_linear", args, nargs, [](const auto& t) {
    return radixlm::small_batch_int8_linear(*t[0], *t[1], *t[2], *t[3], t[4]);
  });
}

PyObject* amx_bf16_linear(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  return call_kernel<3, true>("amx_bf16_linear", args, nargs, [](const auto& t) {
    return radixlm::amx_bf16_linear(*t[0], *t[1], t[2]);
  });
}

// amx_bf16_linear_add(x, weight, residual, bias): torch.ops.radixlm.amx_bf16_linear(x, weight, bias, residual).
PyObject* amx_bf16_linear_add(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  return call_kernel<4, true>("amx_bf16_linear_add", args, nargs, [](const auto& t) {
    return radixlm::amx_bf16_linear(*t[0], *t[1], t[3], t[2]);
  });
}

PyObject* amx_bf16_gated_linear(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  return call_kernel<2, false>("amx_bf16_gated_linear", args, nargs, [](const auto& t) {
    return radixlm::amx_bf16_gated_linear(*t[0], *t[1]);
  });
}

PyObject* bf16_dot_linear(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  return call_kernel<3, true>("bf16_dot_linear", args, nargs, [](const auto& t) {
    return radixlm::bf16_dot_linear(*t[0], *t[1], t[2]);
  });
}

// bf16_packed_linear(x, packed, out_features, bias): torch.ops.radixlm.bf16_packed_linear without the dispatcher.
PyObject* bf16_packed_linear(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (!check_count("bf16_packed_linear", 4, nargs)) return nullptr;
  c10::optional<at::Tensor> x, packed, bias;
  int64_t out_features = 0;
  if (!tensor_arg(args, 0, false, &x) || !tensor_arg(args, 1, false, &packed) || !int_arg(args, 2, &out_features) ||
      !tensor_arg(args, 3, true, &bias)) {
    return nullptr;
  }
  return run_kernel([&] { return radixlm::bf16_packed_linear(*x, *packed, out_features, bias); });
}

PyObject* amx_bf16_available(PyObject*, PyObject*) { return PyBool_FromLong(radixlm::amx_bf16_available()); }

PyObject* avx512_bf16_available(PyObject*, PyObject*) {
  return PyBool_FromLong(radixlm::prefill_attention_available() && radixlm::bf16_dot_available());
}

PyObject* int8_normalize_rows(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  return call_kernel<2, false>("int8_normalize_rows", args, nargs, [](auto& t) {
    return radixlm::int8_normalize_rows(*t[0], *t[1]);
  });
}

// Returns its first argument, rescaled in place.
PyObject* int8_rescale_rows_(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  return call_kernel<3, true>("int8_rescale_rows_", args, nargs, [](auto& t) {
    radixlm::int8_rescale_rows_(*t[0], *t[1], t[2]);
    return *t[0];
  });
}

PyObject* rms_norm_call(const char* name, PyObject* const* args, Py_ssize_t nargs, bool pad_rows) {
  if (!check_count(name, 3, nargs)) return nullptr;
  c10::optional<at::Tensor> x, weight;
  if (!tensor_arg(args, 0, false, &x) || !tensor_arg(args, 1, false, &weight)) return nullptr;
  const double eps = PyFloat_AsDouble(args[2]);
  if (eps == -1.0 && PyErr_Occurred()) return nullptr;
  return run_kernel([&] { return radixlm::rms_norm(*x, *weight, eps, pad_rows); });
}

PyObject* rms_norm(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  return rms_norm_call("rms_norm", args, nargs, false);
}

PyObject* rms_norm_padded(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  return rms_norm_call("rms_norm_padded", args, nargs, true);
}

PyObject* rotary(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  return call_kernel<3, false>("rotary", args, nargs,
                               [](const auto& t) { return radixlm::rotary(*t[0], *t[1], *t[2]); });
}

PyObject* silu_and_mul(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  return call_kernel<1, false>("silu_and_mul", args, nargs,
                               [](const auto& t) { return radixlm::silu_and_mul(*t[0]); });
}

PyObject* greedy_tokens(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  return call_kernel<1, false>("greedy_tokens", args, nargs,
                               [](const auto& t) { return radixlm::greedy_tokens(*t[0]); });
}

PyObject* silu_and_mul_blocks16(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  return call_kernel<1, false>("silu_and_mul_blocks16", args, nargs,
                               [](const auto& t) { return radixlm::silu_and_mul(*t[0], false, true); });
}

PyObject* silu_and_mul_padded(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  return call_kernel<1, false>("silu_and_mul_padded", args, nargs,
                               [](const auto& t) { return radixlm::silu_and_mul(*t[0], true); });
}

// gguf_linear(x, tiles, types, out_features, bias[, path]): torch.ops.radixlm.gguf_linear without the dispatcher
// (tiles a sequence of tensors, types and out_features sequences of ints).
PyObject* gguf_linear(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 5 && nargs != 6) {
    PyErr_Format(PyExc_TypeError, "gguf_linear takes 5 or 6 arguments, got %zd", nargs);
    return nullptr;
  }
  c10::optional<at::Tensor> x, bias;
  std::vector<at::Tensor> tiles;
  std::vector<int64_t> types, out_features;
  int64_t path = radixlm::kGgufPathBest;
  if (!tensor_arg(args, 0, false, &x) || !tensors_arg(args, 1, &tiles) || !ints_arg(args, 2, &types) ||
      !ints_arg(args, 3, &out_features) || !tensor_arg(args, 4, true, &bias) ||
      (nargs == 6 && !int_arg(args, 5, &path))) {
    return nullptr;
  }
  return run_kernel([&] { return radixlm::gguf_linear(*x, tiles, types, out_features, bias, path); });
}

// gguf_rows(tiles, type, in_features, out_features, ids): torch.ops.radixlm.gguf_rows without the dispatcher.
PyObject* gguf_rows(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (!check_count("gguf_rows", 5, nargs)) return nullptr;
  c10::optional<at::Tensor> tiles, ids;
  int64_t type = 0, in_features = 0, out_features = 0;
  if (!tensor_arg(args, 0, false, &tiles) || !int_arg(args, 1, &type) || !int_arg(args, 2, &in_features) ||
      !int_arg(args, 3, &out_features) || !tensor_arg(args, 4, false, &ids)) {
    return nullptr;
  }
  return run_kernel([&] { return radixlm::gguf_rows(*tiles, type, in_features, out_features, *ids); });
}

// The gguf_linear paths this CPU runs, a list of ints, best last.
PyObject* gguf_linear_paths(PyObject*, PyObject*) {
  const std::vector<int64_t> paths = radixlm::gguf_linear_paths();
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(paths.size()));
  if (list == nullptr) return nullptr;
  for (size_t i = 0; i < paths.size(); ++i) {
    PyObject* item = PyLong_FromLongLong(paths[i]);
    if (item == nullptr) {
      Py_DECREF(list);
      return nullptr;
    }
    PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i), item);
  }
  return list;
}

// decode_attention(query, key, value, key_cache, value_cache, block_table, block_offsets, context_lens,
// slot_mapping, block_size, scale, sliding_window, softcap, key_scales, value_scales): one attention layer of a step in which every row
// decodes, from the tensors transformers passes (query [1, Hq, T, D], the new key and value [1, Hkv, T, D]) to
// [1, T, Hq, D]: the views the op needs are taken here, then torch.ops.radixlm.paged_decode_attention runs without
// the dispatcher, writing the new K/V at slot_mapping first.
PyObject* decode_attention(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  constexpr Py_ssize_t kTensors = 9;
  if (!check_count("decode_attention", kTensors + 6, nargs)) return nullptr;
  std::array<c10::optional<at::Tensor>, kTensors> t;
  for (Py_ssize_t i = 0; i < kTensors; ++i) {
    if (!tensor_arg(args, i, false, &t[i])) return nullptr;
  }
  c10::optional<at::Tensor> key_scales, value_scales;  // int8 caches only
  if (!tensor_arg(args, 13, true, &key_scales) || !tensor_arg(args, 14, true, &value_scales)) return nullptr;
  const long long block_size = PyLong_AsLongLong(args[9]);
  if (block_size == -1 && PyErr_Occurred()) return nullptr;
  const double scale = PyFloat_AsDouble(args[10]);
  if (scale == -1.0 && PyErr_Occurred()) return nullptr;
  const long long sliding_window = PyLong_AsLongLong(args[11]);
  if (sliding_window == -1 && PyErr_Occurred()) return nullptr;
  const double softcap = PyFloat_AsDouble(args[12]);
  if (softcap == -1.0 && PyErr_Occurred()) return nullptr;
  return run_kernel([&] {
    for (const auto& tensor : t) TORCH_CHECK(tensor->is_cpu(), "decode_attention takes CPU tensors");
    for (int i = 0; i < 3; ++i) {
      TORCH_CHECK(t[i]->dim() == 4 && t[i]->size(0) == 1, "query, key and value must be [1, H, T, D]");
    }
    // [1, H, T, D] -> [T, H, D] views: the op takes any strides with D contiguous.
    const auto rows = [](const at::Tensor& x) { return x.select(0, 0).transpose(0, 1); };
    const at::Tensor keys = rows(*t[1]), values = rows(*t[2]);
    return radixlm::paged_decode_attention(rows(*t[0]), *t[3], *t[4], *t[5], *t[6], *t[7], block_size, scale,
                                           sliding_window, softcap, t[8], keys, values, key_scales, value_scales)
        .unsqueeze(0);
  });
}

PyMethodDef methods[] = {
    {"small_batch_linear", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(small_batch_linear)),
     METH_FASTCALL, "small_batch_linear(x, weight, bias): torch.ops.radixlm.small_batch_linear without the dispatcher"},
    {"small_batch_int8_linear", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(small_batch_int8_linear)),
     METH_FASTCALL,
     "small_batch_int8_linear(x, weight, weight_scales, weight_sums, bias): torch.ops.radixlm.small_batch_int8_linear "
     "without the dispatcher"},
    {"amx_bf16_linear", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(amx_bf16_linear)), METH_FASTCALL,
     "amx_bf16_linear(x, weight, bias): torch.ops.radixlm.amx_bf16_linear without the dispatcher"},
    {"amx_bf16_gated_linear", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(amx_bf16_gated_linear)),
     METH_FASTCALL, "amx_bf16_gated_linear(x, weight): torch.ops.radixlm.amx_bf16_gated_linear without the dispatcher"},
    {"amx_bf16_linear_add", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(amx_bf16_linear_add)),
     METH_FASTCALL,
     "amx_bf16_linear_add(x, weight, residual, bias): torch.ops.radixlm.amx_bf16_linear(x, weight, bias, residual) "
     "without the dispatcher"},
    {"avx512_bf16_available", avx512_bf16_available, METH_NOARGS,
     "avx512_bf16_available(): whether this CPU runs prefill_attention and bf16_dot_linear (AVX-512 BF16)"},
    {"bf16_dot_linear", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(bf16_dot_linear)), METH_FASTCALL,
     "bf16_dot_linear(x, weight, bias): torch.ops.radixlm.bf16_dot_linear without the dispatcher"},
    {"bf16_packed_linear", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(bf16_packed_linear)), METH_FASTCALL,
     "bf16_packed_linear(x, packed, out_features, bias): torch.ops.radixlm.bf16_packed_linear without the dispatcher"},
    {"amx_bf16_available", amx_bf16_available, METH_NOARGS,
     "amx_bf16_available(): whether this CPU has AMX-BF16 and the OS lets this process use its tiles"},
    {"gguf_linear", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(gguf_linear)), METH_FASTCALL,
     "gguf_linear(x, tiles, types, out_features, bias, path=0): torch.ops.radixlm.gguf_linear without the "
     "dispatcher"},
    {"gguf_rows", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(gguf_rows)), METH_FASTCALL,
     "gguf_rows(tiles, type, in_features, out_features, ids): torch.ops.radixlm.gguf_rows without the dispatcher"},
    {"gguf_linear_paths", gguf_linear_paths, METH_NOARGS,
     "gguf_linear_paths(): the gguf_linear paths this CPU runs (1 portable, 2 AVX2, 3 AVX-512 VNNI), best last"},
    {"int8_normalize_rows", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(int8_normalize_rows)),
     METH_FASTCALL, "int8_normalize_rows(x, row_max): torch.ops.radixlm.int8_normalize_rows without the dispatcher"},
    {"int8_rescale_rows_", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(int8_rescale_rows_)), METH_FASTCALL,
     "int8_rescale_rows_(out, row_max, bias): torch.ops.radixlm.int8_rescale_rows_ without the dispatcher; returns "
     "out"},
    {"rms_norm", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(rms_norm)), METH_FASTCALL,
     "rms_norm(x, weight, eps): torch.ops.radixlm.rms_norm without the dispatcher"},
    {"rms_norm_padded", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(rms_norm_padded)), METH_FASTCALL,
     "rms_norm_padded(x, weight, eps): torch.ops.radixlm.rms_norm(x, weight, eps, pad_rows=True) without the "
     "dispatcher"},
    {"rotary", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(rotary)), METH_FASTCALL,
     "rotary(query_key, cos, sin): torch.ops.radixlm.rotary without the dispatcher"},
    {"silu_and_mul", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(silu_and_mul)), METH_FASTCALL,
     "silu_and_mul(gate_up): torch.ops.radixlm.silu_and_mul without the dispatcher"},
    {"silu_and_mul_blocks16", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(silu_and_mul_blocks16)),
     METH_FASTCALL, "silu_and_mul_blocks16(gate_up): torch.ops.radixlm.silu_and_mul(gate_up, blocks16=True) without "
     "the dispatcher"},
    {"silu_and_mul_padded", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(silu_and_mul_padded)),
     METH_FASTCALL, "silu_and_mul_padded(gate_up): torch.ops.radixlm.silu_and_mul(gate_up, pad_rows=True) without "
     "the dispatcher"},
    {"decode_attention", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(decode_attention)), METH_FASTCALL,
     "decode_attention(query, key, value, key_cache, value_cache, block_table, block_offsets, context_lens, "
     "slot_mapping, block_size, scale, sliding_window, softcap, key_scales, value_scales): one decode layer through "
     "torch.ops.radixlm.paged_decode_attention, without the dispatcher"},
    {"greedy_tokens", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(greedy_tokens)), METH_FASTCALL,
     "greedy_tokens(logits): torch.ops.radixlm.greedy_tokens without the dispatcher"},
    {"decode_plan", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(radixlm_python::decode_plan)),
     METH_FASTCALL, "decode_plan(layers): the C++ plan of a decode step's layers (radixlm/model/decode_stack.py)"},
    {"decode_layers", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(radixlm_python::decode_layers)),
     METH_FASTCALL,
     "decode_layers(plan, hidden, cos, sin, key_caches, value_caches, key_scales, value_scales, block_table, "
     "block_offsets, context_lens, slot_mapping, block_size, part_seconds): every layer of a decode step in one "
     "call"},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

// The module is named after its build (setup.py's VARIANTS: _C, _C_avx512), which torch's BuildExtension passes as
// TORCH_EXTENSION_NAME; Python finds it by the PyInit_ function of that name.
#define RADIXLM_JOIN(a, b) a##b
#define RADIXLM_INIT_FUNCTION(name) RADIXLM_JOIN(PyInit_, name)
#define RADIXLM_QUOTE(name) #name
#define RADIXLM_NAME_STRING(name) RADIXLM_QUOTE(name)

extern "C" PyObject* RADIXLM_INIT_FUNCTION(TORCH_EXTENSION_NAME)(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, RADIXLM_NAME_STRING(TORCH_EXTENSION_NAME), nullptr, -1, methods};
  return PyModule_Create(&module);
}
