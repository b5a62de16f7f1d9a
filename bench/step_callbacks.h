// step_bench --callbacks (see the top of step_bench.cc): host callbacks
// and stream queries on loopback, in round trips.
#ifndef OPSERVER_BENCH_STEP_CALLBACKS_H_
#define OPSERVER_BENCH_STEP_CALLBACKS_H_

namespace opserver::step_bench {

int CallbacksMain();

}  // namespace opserver::step_bench

#endif  // OPSERVER_BENCH_STEP_CALLBACKS_H_
