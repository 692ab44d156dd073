// Argument unpacking for the direct entry points of radixlm._C (csrc/bindings.cpp): each takes its arguments as a
// vectorcall array, checks and unpacks them without the dispatcher's schema parsing, and runs its kernel without the
// GIL. Every helper returns false (or null) with a Python exception set when an argument is wrong.
#pragma once

#include <Python.h>
#include <torch/csrc/autograd/python_variable.h>

#include <array>
#include <cstdint>
#include <exception>
#include <utility>
#include <vector>

namespace radixlm_python {

// args[i] as a tensor (`optional`: None is allowed, giving an empty optional). False with a TypeError set otherwise.
inline bool tensor_arg(PyObject* const* args, Py_ssize_t i, bool optional, c10::optional<at::Tensor>* out) {
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

inline bool check_count(const char* name, Py_ssize_t expected, Py_ssize_t nargs) {
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

// A tuple or list of tensors (`tensors_arg`) or of ints (`ints_arg`) at args[i], or an int (`int_arg`); false
// with a TypeError set otherwise.
inline bool tensors_arg(PyObject* const* args, Py_ssize_t i, std::vector<at::Tensor>* tensors) {
  if (THPVariable_Check(args[i])) {  // a tensor is a sequence too (of its rows)
    PyErr_Format(PyExc_TypeError, "argument %zd must be a list or tuple of tensors, not a tensor", i);
    return false;
  }
  PyObject* seq = PySequence_Fast(args[i], "expected a list or tuple of tensors");
  if (seq == nullptr) return false;
  const Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
  for (Py_ssize_t j = 0; j < count; ++j) {
    PyObject* item = PySequence_Fast_GET_ITEM(seq, j);
    if (!THPVariable_Check(item)) {
      Py_DECREF(seq);
      PyErr_Format(PyExc_TypeError, "argument %zd must be a list or tuple of tensors", i);
      return false;
    }
    tensors->push_back(THPVariable_Unpack(item));
  }
  Py_DECREF(seq);
  return true;
}

inline bool ints_arg(PyObject* const* args, Py_ssize_t i, std::vector<int64_t>* ints) {
  PyObject* seq = PySequence_Fast(args[i], "expected a list or tuple of ints");
  if (seq == nullptr) return false;
  const Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
  for (Py_ssize_t j = 0; j < count; ++j) {
    const long long value = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seq, j));
    if (value == -1 && PyErr_Occurred()) {
      Py_DECREF(seq);
      return false;
    }
    ints->push_back(value);
  }
  Py_DECREF(seq);
  return true;
}

inline bool int_arg(PyObject* const* args, Py_ssize_t i, int64_t* value) {
  const long long v = PyLong_AsLongLong(args[i]);
  if (v == -1 && PyErr_Occurred()) return false;
  *value = v;
  return true;
}

}  // namespace radixlm_python
