// Reading a running opserver's /metrics (--metrics_listen) from tests and
// benchmarks that count what a server did: one plain HTTP/1.0 GET, and sums
// over the Prometheus text format's samples.
//
//   std::string page = scrape::Metrics("127.0.0.1:9464");
//   double fences = scrape::Sum(page, "opserver_pipeline_commands_total",
//                               "command=\"fence\"");
#ifndef OPSERVER_TESTING_METRICS_SCRAPE_H_
#define OPSERVER_TESTING_METRICS_SCRAPE_H_

#include <string>

#include "absl/strings/string_view.h"

namespace opserver::scrape {

// GET /metrics from HOST:PORT (an IPv4 address); "" on any failure.
std::string Metrics(const std::string& address);

// The sum of the samples of `family` on `page` (lines "family{...} value"
// or "family value") whose line contains `filter`; every sample when it is
// empty. 0 when there are none.
double Sum(const std::string& page, absl::string_view family,
           absl::string_view filter = "");

}  // namespace opserver::scrape

#endif  // OPSERVER_TESTING_METRICS_SCRAPE_H_
