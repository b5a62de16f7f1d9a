// opserver --preflight: the check an operator of a new host runs before
// serving it (docs/ascend.md). It opens the devices --device names, lists
// each with its memory, runs every operator once on each of them on a tiny
// tensor (the Evaluate path: copies in, one launch, copy out), and compares
// each output bit for bit with the CPU device's. No port is opened.
#ifndef OPSERVER_RUNTIME_PREFLIGHT_H_
#define OPSERVER_RUNTIME_PREFLIGHT_H_

#include <ostream>
#include <string>
#include <vector>

#include "devices/device.h"
#include "proto/opserver.pb.h"

namespace opserver {

// One Evaluate request per registered operator: eight FLOAT values that
// cross each operator's boundaries (negatives, zero, both signs of small
// values, values past 3 for Hardswish), its DropoutBackward mask a byte
// pattern, every scalar parameter set (its advertised default, or a value
// of its type).
std::vector<v1::EvaluateRequest> PreflightRequests();

// "" when `got` and `want` hold the same shape and values (NaN equal to
// NaN, +0 different from -0); otherwise what differs first.
std::string CompareOutputs(const v1::ValueTensor& got,
                           const v1::ValueTensor& want);

// Writes the report to `out`: a line per device (index, kind, name,
// memory), then a line per device and operator ("ok", or the mismatch or
// error), then a summary. True when every operator matched on every
// device. `reference` computes the expected outputs (the CPU device).
bool RunPreflight(const std::vector<Device*>& devices, Device& reference,
                  std::ostream& out);

}  // namespace opserver

#endif  // OPSERVER_RUNTIME_PREFLIGHT_H_
