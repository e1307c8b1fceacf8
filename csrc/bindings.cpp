// The few Python entry points of torch_shard._C (raw CPython API: no pybind11, no ATen).
//
// pack_layout(shards) reads N ShardMetadata objects in one C pass: their shard_offsets and shard_sizes
// into two int64 buffers, and their placements deduplicated (the distinct placement objects, and per
// shard the index of its own). Doing this in Python costs about a microsecond per shard, more than
// validating the layout in C++; see torch_shard/_support/_native.py.

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

// Owns the references taken while packing, so every exit path releases them.
struct Refs {
  PyObject* fast = nullptr;
  PyObject* by_value = nullptr; // placement -> index (uses the placement's own __eq__/__hash__)
  PyObject* by_key = nullptr;   // (worker name, rank, device) -> index, for exact _remote_device objects
  PyObject* distinct = nullptr; // list of distinct placements, in first-seen order
  PyObject* offsets_name = nullptr;
  PyObject* sizes_name = nullptr;
  PyObject* placement_name = nullptr;
  ~Refs() {
    Py_XDECREF(fast);
    Py_XDECREF(by_value);
    Py_XDECREF(by_key);
    Py_XDECREF(distinct);
    Py_XDECREF(offsets_name);
    Py_XDECREF(sizes_name);
    Py_XDECREF(placement_name);
  }
};

// torch.distributed.remote_device._remote_device (one reference held for the process's lifetime), or
// nullptr with no error set when it cannot be imported.
PyTypeObject* remote_device_type() {
  static PyTypeObject* type = [] {
    PyObject* module = PyImport_ImportModule("torch.distributed.remote_device");
    PyObject* cls = module ? PyObject_GetAttrString(module, "_remote_device") : nullptr;
    Py_XDECREF(module);
    if (cls == nullptr || !PyType_Check(cls)) {
      Py_XDECREF(cls);
      PyErr_Clear();
      return static_cast<PyTypeObject*>(nullptr);
    }
    return reinterpret_cast<PyTypeObject*>(cls);
  }();
  return type;
}

// The value _remote_device.__eq__/__hash__ compare, as a tuple (C-level hash and equality), for an
// object of exactly that class; nullptr (no error) for anything else, nullptr with an error on failure.
PyObject* remote_device_key(PyObject* placement) {
  PyTypeObject* type = remote_device_type();
  if (type == nullptr || Py_TYPE(placement) != type) {
    return nullptr;
  }
  static PyObject* names[3] = {PyUnicode_InternFromString("_worker_name"),
                               PyUnicode_InternFromString("_rank"), PyUnicode_InternFromString("_device")};
  PyObject* key = PyTuple_New(3);
  for (int k = 0; key != nullptr && k < 3; ++k) {
    PyObject* value = names[k] ? PyObject_GetAttr(placement, names[k]) : nullptr;
    if (value == nullptr) {
      Py_CLEAR(key);
      break;
    }
    PyTuple_SET_ITEM(key, k, value);
  }
  return key;
}

// Index of `placement` in refs.distinct by the placement's own equality (appending it if new); -1 on
// error.
int64_t placement_index_by_value(Refs& refs, PyObject* placement);

// Index of `placement` in refs.distinct (appending it if new); -1 on error. Placements are compared
// by value; for exact _remote_device objects through a C-level key instead of their Python
// __hash__/__eq__, which would otherwise dominate packing when every shard has its own placement object.
int64_t placement_index(Refs& refs, PyObject* placement, PyObject*& last, int64_t& last_index) {
  if (placement == last) {
    return last_index; // consecutive shards usually share one placement object
  }
  int64_t index;
  PyObject* key = remote_device_key(placement);
  if (key != nullptr) {
    PyObject* found = PyDict_GetItemWithError(refs.by_key, key);
    if (found != nullptr) {
      index = PyLong_AsLongLong(found);
    } else if (PyErr_Occurred()) {
      index = -1;
    } else {
      // A new key: the by-value table decides (it may hold an equal placement of another class).
      index = placement_index_by_value(refs, placement);
      PyObject* value = index < 0 ? nullptr : PyLong_FromLongLong(index);
      if (value == nullptr || PyDict_SetItem(refs.by_key, key, value) < 0) {
        index = -1;
      }
      Py_XDECREF(value);
    }
    Py_DECREF(key);
  } else if (PyErr_Occurred()) {
    return -1;
  } else {
    index = placement_index_by_value(refs, placement);
  }
  if (index < 0) {
    return -1;
  }
  last = placement;
  last_index = index;
  return index;
}

int64_t placement_index_by_value(Refs& refs, PyObject* placement) {
  PyObject* found = PyDict_GetItemWithError(refs.by_value, placement);
  int64_t index;
  if (found != nullptr) {
    index = PyLong_AsLongLong(found);
  } else if (PyErr_Occurred()) {
    return -1; // unhashable placement
  } else {
    index = PyList_GET_SIZE(refs.distinct);
    PyObject* value = PyLong_FromLongLong(index);
    if (value == nullptr || PyDict_SetItem(refs.by_value, placement, value) < 0 ||
        PyList_Append(refs.distinct, placement) < 0) {
      Py_XDECREF(value);
      return -1;
    }
    Py_DECREF(value);
  }
  return index;
}

// pack_layout(shards) -> (offsets: bytes, sizes: bytes, ndim: int, first_bad: int, index: bytes,
//                         placements: list)
// first_bad is the index of the first shard whose number of dims differs from shard 0's (or whose
// offsets and sizes differ in length), -1 if none; the buffers are then incomplete. index holds one
// int64 per shard into `placements` (None counts as a placement).
// With with_placements false the placements are not read (index is empty, placements []): layout
// validation needs the boxes only.
PyObject* pack(PyObject* shards, bool with_placements) {
  Refs refs;
  refs.fast = PySequence_Fast(shards, "pack_layout expects a sequence of ShardMetadata");
  if (refs.fast == nullptr) {
    return nullptr;
  }
  refs.by_value = PyDict_New();
  refs.by_key = PyDict_New();
  refs.distinct = PyList_New(0);
  refs.offsets_name = PyUnicode_InternFromString("shard_offsets");
  refs.sizes_name = PyUnicode_InternFromString("shard_sizes");
  refs.placement_name = PyUnicode_InternFromString("placement");
  if (!refs.by_value || !refs.by_key || !refs.distinct || !refs.offsets_name || !refs.sizes_name ||
      !refs.placement_name) {
    return nullptr;
  }
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(refs.fast);
  PyObject** items = PySequence_Fast_ITEMS(refs.fast);
  std::string offsets, sizes, index;
  Py_ssize_t ndim = -1;
  Py_ssize_t first_bad = -1;
  PyObject* last = nullptr; // borrowed; kept alive by the ShardMetadata that holds it
  int64_t last_index = -1;
  for (Py_ssize_t i = 0; i < n && first_bad < 0; ++i) {
    PyObject* off = PyObject_GetAttr(items[i], refs.offsets_name);
    PyObject* len = off ? PyObject_GetAttr(items[i], refs.sizes_name) : nullptr;
    PyObject* where = !len              ? nullptr
                      : with_placements ? PyObject_GetAttr(items[i], refs.placement_name)
                                        : Py_NewRef(Py_None);
    if (where == nullptr) {
      Py_XDECREF(off);
      Py_XDECREF(len);
      return nullptr;
    }
    const Py_ssize_t a = append_ints(off, offsets);
    const Py_ssize_t b = a < 0 ? -1 : append_ints(len, sizes);
    const int64_t p = b < 0 ? -1 : with_placements ? placement_index(refs, where, last, last_index) : 0;
    Py_DECREF(off);
    Py_DECREF(len);
    Py_DECREF(where);
    if (a < 0 || b < 0 || p < 0) {
      return nullptr;
    }
    if (with_placements) {
      index.append(reinterpret_cast<const char*>(&p), sizeof(p));
    }
    if (ndim < 0) {
      ndim = b;
    }
    if (a != b || b != ndim) {
      first_bad = i;
    }
  }
  return Py_BuildValue("(y#y#nny#O)", offsets.data(), static_cast<Py_ssize_t>(offsets.size()), sizes.data(),
                       static_cast<Py_ssize_t>(sizes.size()), ndim < 0 ? 0 : ndim, first_bad, index.data(),
                       static_cast<Py_ssize_t>(index.size()), refs.distinct);
}

PyObject* pack_layout(PyObject* /*self*/, PyObject* shards) {
  return pack(shards, /*with_placements=*/true);
}

PyObject* pack_boxes(PyObject* /*self*/, PyObject* shards) {
  return pack(shards, /*with_placements=*/false);
}

PyMethodDef methods[] = {
    {"pack_layout", pack_layout, METH_O,
     "pack_layout(shards) -> (offsets bytes, sizes bytes, ndim, first_bad_index, placement index "
     "bytes, distinct placements)"},
    {"pack_boxes", pack_boxes, METH_O,
     "pack_boxes(shards) -> pack_layout's tuple without the placements (index b'', placements [])"},
    {nullptr, nullptr, 0, nullptr},
};

} // namespace

// Called from PyInit__C (torch_shard.cpp).
PyMethodDef* torch_shard_python_methods() {
  return methods;
}
