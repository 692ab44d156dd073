// Python entry points of decode_layers.cpp: the plan is parsed once into a capsule, each step passes its caches and
// tables. Every malformed argument is a TypeError or ValueError here, before any kernel runs.
#include "decode_layers_python.h"

#include <memory>
#include <utility>

#include "../python_args.h"
#include "decode_layers.h"

namespace radixlm_python {
namespace {

constexpr const char* kPlanName = "radixlm.decode_plan";

// item `i` of tuple `t` as the given kind; false with an exception set otherwise.
bool tensor_item(PyObject* t, Py_ssize_t i, bool optional, c10::optional<at::Tensor>* out) {
  PyObject* item = PyTuple_GET_ITEM(t, i);
  if (optional && item == Py_None) {
    *out = c10::nullopt;
    return true;
  }
  if (!THPVariable_Check(item)) {
    PyErr_Format(PyExc_TypeError, "decode_plan: field %zd must be a tensor%s", i, optional ? " or None" : "");
    return false;
  }
  *out = THPVariable_Unpack(item);
  return true;
}

bool int_item(PyObject* t, Py_ssize_t i, int64_t* out) {
  const long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(t, i));
  if (v == -1 && PyErr_Occurred()) return false;
  *out = v;
  return true;
}

bool float_item(PyObject* t, Py_ssize_t i, double* out) {
  const double v = PyFloat_AsDouble(PyTuple_GET_ITEM(t, i));
  if (v == -1.0 && PyErr_Occurred()) return false;
  *out = v;
  return true;
}

bool tuple_of(PyObject* item, Py_ssize_t size, const char* what) {
  if (PyTuple_Check(item) && PyTuple_GET_SIZE(item) == size) return true;
  PyErr_Format(PyExc_TypeError, "decode_plan: %s must be a tuple of %zd fields", what, size);
  return false;
}

// (kind, weight | None, bias | None, max_rows, tiles, types, outs, gguf_amx_min_rows)
bool parse_linear(PyObject* t, radixlm::layers::Linear* linear) {
  if (!tuple_of(t, 8, "a linear")) return false;
  int64_t kind = 0;
  c10::optional<at::Tensor> weight;
  PyObject* const fields[3] = {PyTuple_GET_ITEM(t, 4), PyTuple_GET_ITEM(t, 5), PyTuple_GET_ITEM(t, 6)};
  if (!int_item(t, 0, &kind) || !tensor_item(t, 1, true, &weight) || !tensor_item(t, 2, true, &linear->bias) ||
      !int_item(t, 3, &linear->max_rows) || !tensors_arg(fields, 0, &linear->tiles) ||
      !ints_arg(fields, 1, &linear->types) || !ints_arg(fields, 2, &linear->outs) ||
      !int_item(t, 7, &linear->gguf_amx_min_rows)) {
    return false;
  }
  if (kind < 0 || kind > 3) {
    PyErr_Format(PyExc_ValueError, "decode_plan: unknown linear kind %lld", static_cast<long long>(kind));
    return false;
  }
  linear->kind = static_cast<radixlm::layers::LinearKind>(kind);
  const bool gguf = linear->kind == radixlm::layers::LinearKind::kGguf;
  if (gguf ? linear->tiles.empty() : !weight.has_value()) {
    PyErr_SetString(PyExc_ValueError, "decode_plan: a GGUF linear needs tiles, the others a weight");
    return false;
  }
  if (weight.has_value()) linear->weight = *weight;
  return true;
}

// (input_norm, input_eps, post_norm, post_eps, qkv, o, gate_up, down, num_heads, num_kv_heads, head_dim, scale,
//  sliding_window)
bool parse_layer(PyObject* t, radixlm::layers::Layer* layer) {
  if (!tuple_of(t, 13, "a layer")) return false;
  c10::optional<at::Tensor> input_norm, post_norm;
  if (!tensor_item(t, 0, false, &input_norm) || !float_item(t, 1, &layer->input_eps) ||
      !tensor_item(t, 2, false, &post_norm) || !float_item(t, 3, &layer->post_eps) ||
      !parse_linear(PyTuple_GET_ITEM(t, 4), &layer->qkv) || !parse_linear(PyTuple_GET_ITEM(t, 5), &layer->o) ||
      !parse_linear(PyTuple_GET_ITEM(t, 6), &layer->gate_up) || !parse_linear(PyTuple_GET_ITEM(t, 7), &layer->down) ||
      !int_item(t, 8, &layer->num_heads) || !int_item(t, 9, &layer->num_kv_heads) ||
      !int_item(t, 10, &layer->head_dim) || !float_item(t, 11, &layer->scale) ||
      !int_item(t, 12, &layer->sliding_window)) {
    return false;
  }
  if (layer->num_heads <= 0 || layer->num_kv_heads <= 0 || layer->head_dim <= 0 ||
      layer->num_heads % layer->num_kv_heads != 0) {
    PyErr_SetString(PyExc_ValueError, "decode_plan: heads and head_dim must be positive, query heads a multiple of "
                                      "KV heads");
    return false;
  }
  layer->input_norm = *input_norm;
  layer->post_norm = *post_norm;
  return true;
}

void free_plan(PyObject* capsule) {
  delete static_cast<radixlm::layers::Plan*>(PyCapsule_GetPointer(capsule, kPlanName));
}

// A list or tuple of tensors, or None (no tensors).
bool optional_tensors(PyObject* const* args, Py_ssize_t i, std::vector<at::Tensor>* out) {
  return args[i] == Py_None || tensors_arg(args, i, out);
}

}  // namespace

PyObject* decode_plan(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (!check_count("decode_plan", 1, nargs)) return nullptr;
  PyObject* seq = PySequence_Fast(args[0], "decode_plan takes a list of layer tuples");
  if (seq == nullptr) return nullptr;
  auto plan = std::make_unique<radixlm::layers::Plan>();
  const Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
  plan->layers.resize(count);
  for (Py_ssize_t i = 0; i < count; ++i) {
    if (!parse_layer(PySequence_Fast_GET_ITEM(seq, i), &plan->layers[i])) {
      Py_DECREF(seq);
      return nullptr;
    }
  }
  Py_DECREF(seq);
  PyObject* capsule = PyCapsule_New(plan.get(), kPlanName, free_plan);
  if (capsule != nullptr) plan.release();
  return capsule;
}

PyObject* decode_layers(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (!check_count("decode_layers", 14, nargs)) return nullptr;
  const auto* plan = static_cast<const radixlm::layers::Plan*>(PyCapsule_GetPointer(args[0], kPlanName));
  if (plan == nullptr) return nullptr;
  c10::optional<at::Tensor> hidden, cos, sin, block_table, block_offsets, context_lens, slot_mapping;
  radixlm::layers::DecodeInputs in;
  if (!tensor_arg(args, 1, false, &hidden) || !tensor_arg(args, 2, false, &cos) || !tensor_arg(args, 3, false, &sin) ||
      !tensors_arg(args, 4, &in.key_caches) || !tensors_arg(args, 5, &in.value_caches) ||
      !optional_tensors(args, 6, &in.key_scales) || !optional_tensors(args, 7, &in.value_scales) ||
      !tensor_arg(args, 8, false, &block_table) || !tensor_arg(args, 9, false, &block_offsets) ||
      !tensor_arg(args, 10, false, &context_lens) || !tensor_arg(args, 11, false, &slot_mapping) ||
      !int_arg(args, 12, &in.block_size)) {
    return nullptr;
  }
  in.block_table = *block_table;
  in.block_offsets = *block_offsets;
  in.context_lens = *context_lens;
  in.slot_mapping = *slot_mapping;
  c10::optional<at::Tensor> part_seconds;
  if (!tensor_arg(args, 13, true, &part_seconds)) return nullptr;
  if (part_seconds.has_value()) {
    if (part_seconds->scalar_type() != at::kDouble || !part_seconds->is_cpu() || !part_seconds->is_contiguous() ||
        part_seconds->numel() != radixlm::layers::kNumStackParts) {
      PyErr_Format(PyExc_ValueError, "decode_layers: part_seconds must be a contiguous float64 CPU tensor of %d",
                   static_cast<int>(radixlm::layers::kNumStackParts));
      return nullptr;
    }
    in.part_seconds = part_seconds->data_ptr<double>();
  }
  return run_kernel([&] { return radixlm::layers::run_layers(*plan, *hidden, *cos, *sin, in); });
}

}  // namespace radixlm_python
