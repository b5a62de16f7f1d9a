// make_seeds' corpus of pipeline_fuzzer: Pipeline batches of plans,
// launches, fences, writes, reads, events, memsets and copies, valid and
// not, some repeated by the driver (fuzz/pipeline_fuzzer.cc).
#ifndef OPSERVER_FUZZ_PIPELINE_SEEDS_H_
#define OPSERVER_FUZZ_PIPELINE_SEEDS_H_

namespace opserver::seeds {

void PipelineSeeds();

}  // namespace opserver::seeds

#endif  // OPSERVER_FUZZ_PIPELINE_SEEDS_H_
