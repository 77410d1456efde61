// --devices / --split of every program: a model split over several devices of this process
// (docs/DISTRIBUTED.md; spark_model_params.n_devices / devices / split_mode).
#pragma once

#include "rendezvous.h"

#include <spark/spark.h>

#include <CLI/CLI.hpp>

#include <chrono>
#include <cstring>
#include <exception>
#include <string>

namespace spark_cli {

struct SplitOptions {
    std::string devices;      // "0,1": CUDA ordinals, one rank each (on the CPU: a thread each)
    std::string split = "tp";  // tp | ep
    int         dist_rank = 0, dist_size = 0;  // several processes (hosts), one GPU each
    std::string dist_addr;                     // host:port where rank 0 hands out the group's id
    int         dist_timeout_s = 120;

    void add(CLI::App & app) {
        app.add_option("--devices", devices, "split the model over these devices, comma separated (e.g. 0,1; on the CPU: that many ranks as threads)");
        app.add_option("--split", split, "--devices: tp (tensor parallelism) or ep (experts whole, a range per device; attention as tp)")
            ->check(CLI::IsMember({"tp", "ep"}));
        app.add_option("--dist-size", dist_size, "several processes (hosts): the number of ranks, one GPU each (--device cuda)")->check(CLI::Range(2, 64));
        app.add_option("--dist-rank", dist_rank, "--dist-size: this process's rank (0 .. size-1)")->check(CLI::Range(0, 63));
        app.add_option("--dist-addr", dist_addr, "--dist-size: host:port where rank 0 listens and hands the group's id to the others (rank 0: 0.0.0.0:PORT listens everywhere)");
        app.add_option("--dist-timeout", dist_timeout_s, "--dist-size: seconds to wait for every rank to join")->check(CLI::Range(1, 3600));
    }

    int count() const {
        int n = devices.empty() ? 0 : 1;
        for (char c : devices) n += c == ',';
        return n;
    }

    // Sets the params' split; false with the reason for a list that does not parse, or a group of
    // processes that did not form (the rendezvous at --dist-addr).
    bool apply(spark_model_params & p, std::string & error) const {
        p.split_mode = split == "ep" ? SPARK_SPLIT_EXPERT : SPARK_SPLIT_TENSOR;
        if (dist_size > 1) return join_group(p, error);
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
        p.n_devices = n;
        return true;
    }

    // Rank 0 makes the group's id and hands it to the others over TCP; every rank gets it.
    bool join_group(spark_model_params & p, std::string & error) const {
        if (!devices.empty() || dist_rank >= dist_size || dist_addr.empty()) {
            error = "--dist-size needs --dist-rank below it and --dist-addr, and no --devices (one GPU a process: --device cuda)";
            return false;
        }
        std::vector<uint8_t> id(sizeof(p.dist_id));
        if (dist_rank == 0 && spark_dist_unique_id(id.data()) != SPARK_OK) {
            error = std::string("--dist-size: ") + spark_last_error();
            return false;
        }
        try {
            id = rendezvous(dist_addr, dist_rank, dist_size, dist_rank == 0 ? id : std::vector<uint8_t>{}, std::chrono::seconds(dist_timeout_s));
        } catch (const std::exception & e) {
            error = std::string("--dist-addr: ") + e.what();
            return false;
        }
        if (id.size() != sizeof(p.dist_id)) {
            error = "--dist-addr: rank 0 sent a group id of " + std::to_string(id.size()) + " bytes";
            return false;
        }
        std::memcpy(p.dist_id, id.data(), id.size());
        p.dist_rank = dist_rank, p.dist_size = dist_size;
        return true;
    }

    // " (tp x2)" for a split model, "" for one device: what a report names the model with.
    std::string label() const {
        const int n = dist_size > 1 ? dist_size : count();
        return n > 1 ? " (" + split + " x" + std::to_string(n) + (dist_size > 1 ? " processes" : "") + ")" : std::string();
    }
};

}  // namespace spark_cli
