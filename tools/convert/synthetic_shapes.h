// The synthetic shapes of the architectures (Architecture::synthetic_shapes in src/runtime/models),
// as the tools' --help lists them (spark-convert --synthetic SHAPE:FORMAT, spark-bench --synthetic
// SHAPES). The library has no call that lists
// them, so this is the tools' one list; tests/tools/cli.sh checks it against the library's own
// (the message of an unknown shape). Header-only, no dependencies (spark-bench includes it too).
#pragma once

namespace spark_cli {

inline constexpr const char * kSyntheticShapes = "qwen3-8b, tiny-qwen3, qwen3-30b-a3b, tiny-qwen3-moe, tiny-qwen3-moe-top8, qwen3-next-80b-a3b, tiny-qwen3-next, minimax-m2, tiny-minimax-m2";

}  // namespace spark_cli
