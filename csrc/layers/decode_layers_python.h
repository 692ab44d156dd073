// The direct entry points of decode_layers.cpp (registered in csrc/bindings.cpp's method table).
#pragma once

#include <Python.h>

namespace radixlm_python {

// decode_plan(layers) -> a capsule holding the C++ plan (radixlm::layers::Plan) built from a list of per-layer
// tuples; see radixlm/model/decode_stack.py for their fields.
PyObject* decode_plan(PyObject*, PyObject* const* args, Py_ssize_t nargs);

// decode_layers(plan, hidden, cos, sin, key_caches, value_caches, key_scales, value_scales, block_table,
// block_offsets, context_lens, slot_mapping, block_size, part_seconds) -> hidden after every layer
// (radixlm::layers::run_layers); part_seconds: None, or float64 [kNumStackParts] that each part's seconds are added to.
PyObject* decode_layers(PyObject*, PyObject* const* args, Py_ssize_t nargs);

}  // namespace radixlm_python
