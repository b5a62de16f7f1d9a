// Where make_seeds writes a fuzzer's seed (corpus/<fuzzer>/<name>), and
// the tensor descriptor its requests are made of.
#ifndef OPSERVER_FUZZ_SEED_FILES_H_
#define OPSERVER_FUZZ_SEED_FILES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "proto/opserver.pb.h"

namespace opserver::seeds {

// The corpus root, make_seeds' argument.
void SetRoot(std::string root);
// Writes root/<fuzzer>/<name>; exits the program when it cannot.
void Write(const std::string& fuzzer, const std::string& name,
           const std::string& bytes);

v1::TensorDesc Desc(uint64_t buffer, v1::DataType dtype,
                    std::vector<int64_t> shape,
                    std::vector<int64_t> strides = {}, int64_t offset = 0,
                    uint64_t buffer_offset = 0);

}  // namespace opserver::seeds

#endif  // OPSERVER_FUZZ_SEED_FILES_H_
