// CANN's aclnn/aclnn_base.h: the same declarations as aclnn/acl_meta.h.
#ifndef OPSERVER_CLIENT_INCLUDE_ACLNN_ACLNN_BASE_H_
#define OPSERVER_CLIENT_INCLUDE_ACLNN_ACLNN_BASE_H_

#include "aclnn/acl_meta.h"

#endif  // OPSERVER_CLIENT_INCLUDE_ACLNN_ACLNN_BASE_H_
