#include "common/log.h"

#include <mutex>

namespace spark {

namespace {
std::mutex           g_mutex;
spark_log_callback   g_callback  = nullptr;
void *               g_user_data = nullptr;
}  // namespace

void log_message(spark_log_level level, const char * text) {
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_callback) g_callback(level, text, g_user_data);
}

}  // namespace spark

extern "C" SPARK_API void spark_log_set(spark_log_callback callback, void * user_data) {
    std::lock_guard<std::mutex> lock(spark::g_mutex);
    spark::g_callback  = callback;
    spark::g_user_data = user_data;
}
