// The few Python entry points of torch_shard._C (raw CPython API: no pybind11, no ATen).
//
// pack_boxes(shards) reads the shard_offsets and shard_sizes lists of N ShardMetadata objects into two
// int64 buffers in one C pass. Doing this in Python costs about a microsecond per shard, more than
// validating the layout in C++; see _native.shard_box_tensors.

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>
#include <string>

namespace {

// Appends the ints of `seq` (a list or tuple) to `out`; returns the number appended or -1 on error.
Py_ssize_t append_ints(PyObject* seq, std::string& out) {
  PyObject* fast = PySequence_Fast(seq, "shard_offsets and shard_sizes must be sequences of ints");
  if (fast == nullptr) {
    return -1;
  }
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  PyObject** items = PySequence_Fast_ITEMS(fast);
  for (Py_ssize_t i = 0; i < n; ++i) {
    const long long value = PyLong_AsLongLong(items[i]);
    if (value == -1 && PyErr_Occurred()) {
      Py_DECREF(fast);
      return -1;
    }
    const int64_t v = static_cast<int64_t>(value);
    out.append(reinterpret_cast<const char*>(&v), sizeof(v));
  }
  Py_DECREF(fast);
  return n;
}

// pack_boxes(shards) -> (offsets: bytes, sizes: bytes, ndim: int, first_bad: int)
// first_bad is the index of the first shard whose number of dims differs from shard 0's (or whose
// offsets and sizes differ in length), -1 if none; the buffers are then incomplete.
PyObject* pack_boxes(PyObject* /*self*/, PyObject* shards) {
  PyObject* fast = PySequence_Fast(shards, "pack_boxes expects a sequence of ShardMetadata");
  if (fast == nullptr) {
    return nullptr;
  }
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  PyObject** items = PySequence_Fast_ITEMS(fast);
  std::string offsets, sizes;
  Py_ssize_t ndim = -1;
  Py_ssize_t first_bad = -1;
  PyObject* offsets_name = PyUnicode_InternFromString("shard_offsets");
  PyObject* sizes_name = PyUnicode_InternFromString("shard_sizes");
  for (Py_ssize_t i = 0; i < n && first_bad < 0; ++i) {
    PyObject* off = PyObject_GetAttr(items[i], offsets_name);
    PyObject* len = off ? PyObject_GetAttr(items[i], sizes_name) : nullptr;
    if (off == nullptr || len == nullptr) {
      Py_XDECREF(off);
      Py_DECREF(fast);
      Py_DECREF(offsets_name);
      Py_DECREF(sizes_name);
      return nullptr;
    }
    const Py_ssize_t a = append_ints(off, offsets);
    const Py_ssize_t b = a < 0 ? -1 : append_ints(len, sizes);
    Py_DECREF(off);
    Py_DECREF(len);
    if (a < 0 || b < 0) {
      Py_DECREF(fast);
      Py_DECREF(offsets_name);
      Py_DECREF(sizes_name);
      return nullptr;
    }
    if (ndim < 0) {
      ndim = b;
    }
    if (a != b || b != ndim) {
      first_bad = i;
    }
  }
  Py_DECREF(fast);
  Py_DECREF(offsets_name);
  Py_DECREF(sizes_name);
  return Py_BuildValue("(y#y#nn)", offsets.data(), static_cast<Py_ssize_t>(offsets.size()),
                       sizes.data(), static_cast<Py_ssize_t>(sizes.size()), ndim < 0 ? 0 : ndim,
                       first_bad);
}

PyMethodDef methods[] = {
    {"pack_boxes", pack_boxes, METH_O,
     "pack_boxes(shards) -> (offsets bytes, sizes bytes, ndim, first_bad_index)"},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

// Called from PyInit__C (torch_shard.cpp).
PyMethodDef* torch_shard_python_methods() {
  return methods;
}
