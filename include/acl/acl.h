// aclnn-compatible C API of opserver: CANN's acl/acl.h subset.
//
// Environment: OPSERVER_ADDRESS (HOST:PORT, default 127.0.0.1:50051) names
// the server; OPSERVER_TIMEOUT_MS (default 5000) bounds connecting and each
// call except aclrtSynchronizeStream, which waits up to
// OPSERVER_SYNC_TIMEOUT_MS (default 600000), as do transfers and
// aclrtDestroyStream. Thread-safe; a thread waiting in aclrtSynchronizeStream
// or aclrtMemcpy does not hold up other threads' calls.
#ifndef OPSERVER_CLIENT_INCLUDE_ACL_ACL_H_
#define OPSERVER_CLIENT_INCLUDE_ACL_ACL_H_

#include "acl/acl_base.h"
#include "acl/acl_rt.h"

#ifdef __cplusplus
extern "C" {
#endif

// Reads the environment; `configPath` is accepted and ignored.
ACL_FUNC_VISIBILITY aclError aclInit(const char *configPath);
// Closes the session if aclrtResetDevice was not called.
ACL_FUNC_VISIBILITY aclError aclFinalize(void);

#ifdef __cplusplus
}
#endif

#endif  // OPSERVER_CLIENT_INCLUDE_ACL_ACL_H_
