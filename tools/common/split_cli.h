// --devices / --split of every program: a model split over several devices of this process
// (docs/DISTRIBUTED.md; spark_model_params.n_devices / devices / split_mode).
#pragma once

#include <spark/spark.h>

#include <CLI/CLI.hpp>

#include <string>

namespace spark_cli {

struct SplitOptions {
    std::string devices;      // "0,1": CUDA ordinals, one rank each (on the CPU: a thread each)
    std::string split = "tp";  // tp | ep

    void add(CLI::App & app) {
        app.add_option("--devices", devices, "split the model over these devices, comma separated (e.g. 0,1; on the CPU: that many ranks as threads)");
        app.add_option("--split", split, "--devices: tp (tensor parallelism) or ep (experts whole, a range per device; attention as tp)")
            ->check(CLI::IsMember({"tp", "ep"}));
    }

    int count() const {
        int n = devices.empty() ? 0 : 1;
        for (char c : devices) n += c == ',';
        return n;
    }

    // Sets the params' split; false with the reason for a list that does not parse.
    bool apply(spark_model_params & p, std::string & error) const {
        if (devices.empty()) return true;
        int         n = 0;
        std::string item;
        for (size_t i = 0; i <= devices.size(); ++i) {
            if (i < devices.size() && devices[i] != ',') {
                item += devices[i];
                continue;
            }
            if (n >= 8) {
                error = "--devices: at most 8 devices";
                return false;
            }
            if (item.empty() || item.find_first_not_of("0123456789") != std::string::npos || item.size() > 3) {
                error = "--devices: '" + devices + "' is not a comma-separated list of device numbers";
                return false;
            }
            p.devices[n++] = std::stoi(item);
            item.clear();
        }
        p.n_devices  = n;
        p.split_mode = split == "ep" ? SPARK_SPLIT_EXPERT : SPARK_SPLIT_TENSOR;
        return true;
    }

    // " (tp x2)" for a split model, "" for one device: what a report names the model with.
    std::string label() const { return count() > 1 ? " (" + split + " x" + std::to_string(count()) + ")" : std::string(); }
};

}  // namespace spark_cli
