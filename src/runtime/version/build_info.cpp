// What this libspark is: its version, the commit it was built from, its backends and CUDA targets.
// A component of its own so that programs linking only parts of the library (spark-tokenize) can
// print the same --version line as the others.
#include "spark_commit.h"  // generated: SPARK_GIT_COMMIT

#include <spark/spark.h>

#include <string>

namespace {

#define SPARK_STR2(x) #x
#define SPARK_STR(x) SPARK_STR2(x)
const char * kVersion = SPARK_STR(SPARK_VERSION_MAJOR) "." SPARK_STR(SPARK_VERSION_MINOR) "." SPARK_STR(SPARK_VERSION_PATCH);

}  // namespace

extern "C" {

SPARK_API const char * spark_version(void) { return kVersion; }

SPARK_API const char * spark_build_info(void) {
    static const std::string info = std::string("spark ") + kVersion + " (commit " SPARK_GIT_COMMIT ") backends: cpu"
#if SPARK_HAS_CUDA
                                    + " cuda (targets " SPARK_CUDA_TARGETS ")"
#endif
        ;
    return info.c_str();
}

}  // extern "C"
