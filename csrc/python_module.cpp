// The module radixlm._C. Importing it runs the dispatcher registrations of the other files (torch.ops.radixlm.*,
// which torch.compile and the reference tests use); its own functions call the small-batch linear kernels, the
// RMSNorm and the rotary embedding directly.
//
// Why a second entry point: a decode step at batch 1 makes about 120 linear calls of 10-30 microseconds each and 61
// norms of a few, and a call through torch.ops parses its arguments against the schema and boxes them, about 1-2
// microseconds. These functions unpack their arguments and call the kernel, releasing the GIL around it as torch.ops
// does.

#include <Python.h>
#include <torch/csrc/autograd/python_variable.h>

#include <array>
#include <exception>
#include <utility>

#include "linear.h"
#include "rms_norm.h"
#include "rotary.h"

namespace {

// args[i] as a tensor (`optional`: None is allowed, giving an empty optional). False with a TypeError set otherwise.
bool tensor_arg(PyObject* const* args, Py_ssize_t i, bool optional, c10::optional<at::Tensor>* out) {
  if (optional && args[i] == Py_None) {
    *out = c10::nullopt;
    return true;
  }
  if (!THPVariable_Check(args[i])) {
    PyErr_Format(PyExc_TypeError, "argument %zd must be a tensor%s", i, optional ? " or None" : "");
    return false;
  }
  *out = THPVariable_Unpack(args[i]);
  return true;
}

// kernel() as a Python tensor, run without the GIL, or null with the error set: a failed check in the kernel is a
// RuntimeError, as through torch.ops.
template <typename Kernel>
PyObject* run_kernel(Kernel kernel) {
  at::Tensor out;
  std::exception_ptr error;
  PyThreadState* state = PyEval_SaveThread();
  try {
    out = kernel();
  } catch (...) {
    error = std::current_exception();
  }
  PyEval_RestoreThread(state);
  if (error) {
    try {
      std::rethrow_exception(error);
    } catch (const c10::Error& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what_without_backtrace());
    } catch (const std::exception& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
    } catch (...) {
      PyErr_SetString(PyExc_RuntimeError, "unknown C++ exception");
    }
    return nullptr;
  }
  return THPVariable_Wrap(std::move(out));
}

bool check_count(const char* name, Py_ssize_t expected, Py_ssize_t nargs) {
  if (nargs == expected) return true;
  PyErr_Format(PyExc_TypeError, "%s takes %zd arguments, got %zd", name, expected, nargs);
  return false;
}

// Unpacks `kArgs` tensor arguments (the last one may be None when kLastOptional) and returns kernel(tensors) (see
// run_kernel).
template <size_t kArgs, bool kLastOptional, typename Kernel>
PyObject* call_kernel(const char* name, PyObject* const* args, Py_ssize_t nargs, Kernel kernel) {
  if (!check_count(name, static_cast<Py_ssize_t>(kArgs), nargs)) return nullptr;
  std::array<c10::optional<at::Tensor>, kArgs> tensors;
  for (size_t i = 0; i < kArgs; ++i) {
    const bool optional = kLastOptional && i + 1 == kArgs;
    if (!tensor_arg(args, static_cast<Py_ssize_t>(i), optional, &tensors[i])) return nullptr;
  }
  return run_kernel([&] { return kernel(tensors); });
}

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

PyObject* rms_norm(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (!check_count("rms_norm", 3, nargs)) return nullptr;
  c10::optional<at::Tensor> x, weight;
  if (!tensor_arg(args, 0, false, &x) || !tensor_arg(args, 1, false, &weight)) return nullptr;
  const double eps = PyFloat_AsDouble(args[2]);
  if (eps == -1.0 && PyErr_Occurred()) return nullptr;
  return run_kernel([&] { return radixlm::rms_norm(*x, *weight, eps); });
}

PyObject* rotary(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  return call_kernel<3, false>("rotary", args, nargs,
                               [](const auto& t) { return radixlm::rotary(*t[0], *t[1], *t[2]); });
}

PyMethodDef methods[] = {
    {"small_batch_linear", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(small_batch_linear)),
     METH_FASTCALL, "small_batch_linear(x, weight, bias): torch.ops.radixlm.small_batch_linear without the dispatcher"},
    {"small_batch_int8_linear", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(small_batch_int8_linear)),
     METH_FASTCALL,
     "small_batch_int8_linear(x, weight, weight_scales, weight_sums, bias): torch.ops.radixlm.small_batch_int8_linear "
     "without the dispatcher"},
    {"rms_norm", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(rms_norm)), METH_FASTCALL,
     "rms_norm(x, weight, eps): torch.ops.radixlm.rms_norm without the dispatcher"},
    {"rotary", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(rotary)), METH_FASTCALL,
     "rotary(query_key, cos, sin): torch.ops.radixlm.rotary without the dispatcher"},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

extern "C" PyObject* PyInit__C(void) {
  static PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, methods};
  return PyModule_Create(&module);
}
