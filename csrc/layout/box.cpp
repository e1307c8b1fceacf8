#include "layout/box.h"

#include <sstream>

#include <c10/util/Exception.h>

namespace torch_shard {
namespace layout {

std::string dims_str(const Dims& dims) {
  std::ostringstream out;
  out << '[';
  for (size_t i = 0; i < dims.size(); ++i) {
    out << (i ? ", " : "") << dims[i];
  }
  out << ']';
  return out.str();
}

std::string describe_box(const Box& box, size_t index) {
  return "#" + std::to_string(index) + " (offsets " + dims_str(box.offsets) + ", sizes " +
         dims_str(box.sizes) + ")";
}

}  // namespace layout
}  // namespace torch_shard
