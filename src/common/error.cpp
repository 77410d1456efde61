#include "common/error.h"

namespace spark {

static thread_local std::string g_last_error;

void set_last_error(const std::string & message) { g_last_error = message; }
const char * get_last_error() { return g_last_error.c_str(); }

}  // namespace spark

extern "C" {

SPARK_API const char * spark_last_error(void) { return spark::get_last_error(); }

SPARK_API const char * spark_status_str(spark_status status) {
    switch (status) {
        case SPARK_OK: return "SPARK_OK";
        case SPARK_ERR_INVALID_ARGUMENT: return "SPARK_ERR_INVALID_ARGUMENT";
        case SPARK_ERR_IO: return "SPARK_ERR_IO";
        case SPARK_ERR_INVALID_FORMAT: return "SPARK_ERR_INVALID_FORMAT";
        case SPARK_ERR_UNSUPPORTED: return "SPARK_ERR_UNSUPPORTED";
        case SPARK_ERR_MISSING_TENSOR: return "SPARK_ERR_MISSING_TENSOR";
        case SPARK_ERR_SHAPE_MISMATCH: return "SPARK_ERR_SHAPE_MISMATCH";
        case SPARK_ERR_CONTEXT_FULL: return "SPARK_ERR_CONTEXT_FULL";
        case SPARK_ERR_INVALID_TOKEN: return "SPARK_ERR_INVALID_TOKEN";
        case SPARK_ERR_INVALID_BATCH: return "SPARK_ERR_INVALID_BATCH";
        case SPARK_ERR_OUT_OF_MEMORY: return "SPARK_ERR_OUT_OF_MEMORY";
        case SPARK_ERR_DEVICE: return "SPARK_ERR_DEVICE";
        case SPARK_ERR_BUFFER_TOO_SMALL: return "SPARK_ERR_BUFFER_TOO_SMALL";
        case SPARK_ERR_INVALID_TEXT: return "SPARK_ERR_INVALID_TEXT";
        case SPARK_ERR_TEMPLATE: return "SPARK_ERR_TEMPLATE";
        case SPARK_ERR_ABORTED: return "SPARK_ERR_ABORTED";
        case SPARK_ERR_INTERNAL: return "SPARK_ERR_INTERNAL";
    }
    return "SPARK_ERR_UNKNOWN";
}

}  // extern "C"
