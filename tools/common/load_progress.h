// The progress bar of spark-chat and spark-bench while spark_model_load runs, from the
// load_progress callback of spark_model_params:
//
//   loading  [#########...............]  7.4 / 16.9 GB  2.3 GB/s
//
// redrawn in place ('\r') at most 20 times a second (the callback compares a steady clock, it never
// waits), on stderr and only when stderr is a terminal; finish() erases it. A cancel flag (set by a
// SIGINT handler) makes the callback return false, so the load fails with SPARK_ERR_ABORTED. While
// the bar is up, the library's log lines go through it (the bar is erased first), so a warning does
// not land in the middle of the bar. spark-convert draws its bar with render() too (with an ETA).
// Header-only: each program links only libspark.
#pragma once

#include <spark/spark.h>

#include "log_stderr.h"

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <unistd.h>

namespace spark_cli {

class LoadProgress {
public:
    using Clock = std::chrono::steady_clock;

    // draw: show the bar (default: when stderr is a terminal). cancel: a flag set asynchronously (a
    // signal handler); while it is non-zero the callback stops the load.
    explicit LoadProgress(bool draw = isatty(STDERR_FILENO) != 0, const volatile std::sig_atomic_t * cancel = nullptr,
                          const char * label = "loading")
        : draw_(draw), cancel_(cancel), label_(label) {}
    ~LoadProgress() { finish(); }
    LoadProgress(const LoadProgress &)             = delete;
    LoadProgress & operator=(const LoadProgress &) = delete;

    // Hooks the bar into `mp` (load_progress); call right before spark_model_load, which starts the
    // clock of the speed figure. Routes the library's log through the bar until finish().
    void attach(spark_model_params & mp) {
        mp.load_progress           = &LoadProgress::on_progress;
        mp.load_progress_user_data = this;
        start_                     = Clock::now();
        last_draw_                 = start_;
        drawn_ = false, cancelled_ = false, calls_ = 0, done_ = total_ = 0;
        if (draw_) {
            spark_log_set(&LoadProgress::on_log, this);
            logging_ = true;
        }
    }

    // Erases the bar (call when spark_model_load has returned, before printing anything) and puts
    // the plain stderr log back.
    void finish() {
        std::lock_guard<std::mutex> lock(mutex_);
        erase_locked();
        if (logging_) {
            install_stderr_log();
            logging_ = false;
        }
    }

    bool     cancelled() const { return cancelled_; }  // the callback stopped the load
    uint64_t calls() const { return calls_; }          // times the runtime called it
    uint64_t bytes_total() const { return total_; }    // the last total it reported

    // The bar's text for `done` of `total` bytes after `seconds` (no '\r'); total 0: unknown. `eta`:
    // also the time left at the speed so far ("  ETA 42s"), while something is left (spark-convert).
    static std::string render(uint64_t done, uint64_t total, double seconds, const char * label = "loading", int width = 24,
                              bool eta = false) {
        const double unit  = total >= 1000000000ull ? 1e9 : 1e6;
        const char * uname = total >= 1000000000ull ? "GB" : "MB";
        std::string  bar(size_t(width), '.');
        if (total > 0) {
            const double f = done >= total ? 1.0 : double(done) / double(total);
            bar.replace(0, size_t(f * width + 1e-9), size_t(f * width + 1e-9), '#');
        }
        char buf[160];
        int  n = total > 0 ? std::snprintf(buf, sizeof buf, "%s  [%s]  %.1f / %.1f %s", label, bar.c_str(), double(done) / unit, double(total) / unit, uname)
                           : std::snprintf(buf, sizeof buf, "%s  [%s]", label, bar.c_str());
        if (n < 0) n = 0;
        if (seconds > 0.05 && done > 0 && size_t(n) < sizeof buf) {
            const double rate = double(done) / seconds;
            const int m = std::snprintf(buf + n, sizeof buf - size_t(n), "  %.1f %s", rate >= 1e9 ? rate / 1e9 : rate / 1e6, rate >= 1e9 ? "GB/s" : "MB/s");
            if (eta && total > done && m > 0 && size_t(n + m) < sizeof buf) {
                const long left = std::lround(double(total - done) / rate);
                if (left < 100) std::snprintf(buf + n + m, sizeof buf - size_t(n + m), "  ETA %lds", left);
                else if (left < 3600) std::snprintf(buf + n + m, sizeof buf - size_t(n + m), "  ETA %ldm%02lds", left / 60, left % 60);
                else std::snprintf(buf + n + m, sizeof buf - size_t(n + m), "  ETA %ldh%02ldm", left / 3600, left % 3600 / 60);
            }
        }
        return buf;
    }

private:
    static bool on_progress(uint64_t done, uint64_t total, void * user) {
        auto * self = static_cast<LoadProgress *>(user);
        ++self->calls_;
        self->done_  = done;
        self->total_ = total;
        if (self->cancel_ && *self->cancel_) {
            self->cancelled_ = true;
            return false;
        }
        if (self->draw_) {
            const auto                  now = Clock::now();
            std::lock_guard<std::mutex> lock(self->mutex_);
            // The first call and the last one (done == total) always draw; others at most every 50 ms.
            if (!self->drawn_ || (total > 0 && done >= total) || now - self->last_draw_ >= std::chrono::milliseconds(50)) {
                self->last_draw_ = now;
                const std::string line = render(done, total, std::chrono::duration<double>(now - self->start_).count(), self->label_);
                std::fprintf(stderr, "\r%s\033[K", line.c_str());
                std::fflush(stderr);
                self->drawn_ = true;
            }
        }
        return true;
    }

    static void on_log(spark_log_level level, const char * text, void * user) {
        auto * self = static_cast<LoadProgress *>(user);
        std::lock_guard<std::mutex> lock(self->mutex_);
        if (level <= SPARK_LOG_INFO) self->erase_locked();  // the next progress call draws it again
        log_to_stderr(level, text, nullptr);
    }

    void erase_locked() {
        if (!drawn_) return;
        std::fputs("\r\033[K", stderr);
        std::fflush(stderr);
        drawn_ = false;
    }

    const bool                          draw_;
    const volatile std::sig_atomic_t *  cancel_;
    const char *                        label_;
    std::mutex                          mutex_;  // the bar's line on stderr (log lines may come from other threads)
    Clock::time_point                   start_{}, last_draw_{};
    bool                                drawn_ = false, cancelled_ = false, logging_ = false;
    uint64_t                            calls_ = 0, done_ = 0, total_ = 0;
};

}  // namespace spark_cli
