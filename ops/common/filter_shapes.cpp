#include "ops/common/filter_shapes.h"

namespace customconv {

Border parse_border(const char* op, c10::string_view name) {
  if (name == "zeros") return Border::Zeros;
  if (name == "reflect") return Border::Reflect;
  if (name == "replicate") return Border::Replicate;
  if (name == "circular") return Border::Circular;
  TORCH_CHECK(false, op,
              ": border must be one of \"zeros\", \"reflect\", \"replicate\", "
              "\"circular\"; got \"",
              std::string(name), "\"");
}

}  // namespace customconv
