#include "backend/spec_ops.h"

const ds_spec_ops ds_spec_ops_none; /* zero-initialized: every op NULL */
