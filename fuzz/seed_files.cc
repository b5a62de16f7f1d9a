#include "fuzz/seed_files.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <utility>

namespace opserver::seeds {
namespace {

std::string& Root() {
  static std::string* const root = new std::string();
  return *root;
}

}  // namespace

void SetRoot(std::string root) { Root() = std::move(root); }

void Write(const std::string& fuzzer, const std::string& name,
           const std::string& bytes) {
  const std::string path = Root() + "/" + fuzzer + "/" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  if (!out) {
    std::fprintf(stderr, "cannot write %s (does the directory exist?)\n",
                 path.c_str());
    std::exit(1);
  }
}

v1::TensorDesc Desc(uint64_t buffer, v1::DataType dtype,
                    std::vector<int64_t> shape, std::vector<int64_t> strides,
                    int64_t offset, uint64_t buffer_offset) {
  v1::TensorDesc d;
  d.set_buffer(buffer);
  d.set_dtype(dtype);
  for (int64_t v : shape) d.add_shape(v);
  for (int64_t v : strides) d.add_strides(v);
  d.set_offset(offset);
  d.set_buffer_offset(buffer_offset);
  return d;
}

}  // namespace opserver::seeds
