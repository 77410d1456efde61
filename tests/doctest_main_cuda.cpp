// main of test-cuda: without a usable CUDA device (no GPU, no driver, or a compute capability
// below 8.0) the test exits with 77, which ctest reports as skipped (SKIP_RETURN_CODE in
// tests/CMakeLists.txt), not failed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>
#include <spark/spark.h>

#include <cstdio>

int main(int argc, char ** argv) {
    const int32_t     n = spark_cuda_device_count();
    spark_device_info info{};
    if (n < 1) {
        std::printf("test-cuda: skipped: no CUDA device (spark_cuda_device_count() = %d)\n", int(n));
        return 77;
    }
    if (spark_cuda_device_info(0, &info) != SPARK_OK) {
        std::printf("test-cuda: skipped: CUDA device 0 is not usable: %s\n", spark_last_error());
        return 77;
    }
    doctest::Context context(argc, argv);
    return context.run();
}
