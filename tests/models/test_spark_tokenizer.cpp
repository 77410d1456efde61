// The demo model converted to a spark file keeps its tokenizer and chat template: the same ids,
// text and rendering as the Hugging Face directory, from the model and from spark_tokenizer_load.
#include "converter.h"
#include "harness.h"

#include <filesystem>

using namespace test;

TEST_CASE("spark file carries the tokenizer and chat template") {
    const std::string dir  = std::string(SPARK_TEST_DATA) + "/../../examples/models/spark-demo-coder-moe";
    const auto        tmp  = std::filesystem::temp_directory_path() / ("spark-tok-file-" + std::to_string(::getpid()) + ".spark");
    std::filesystem::remove(tmp);
    spark::convert::Options o;
    o.input  = dir;
    o.output = tmp.string();
    spark::convert::convert(o);

    ModelPtr from_dir  = load_model(dir, SPARK_DEVICE_CPU);
    ModelPtr from_file = load_model(tmp.string(), SPARK_DEVICE_CPU);
    spark_tokenizer * standalone = nullptr;
    REQUIRE(spark_tokenizer_load(tmp.c_str(), &standalone) == SPARK_OK);
    const spark_tokenizer * toks[] = {spark_model_get_tokenizer(from_dir.get()), spark_model_get_tokenizer(from_file.get()), standalone};
    for (const spark_tokenizer * t : toks) REQUIRE(t != nullptr);

    const std::string text = "<|im_start|>user\ndef merge_dicts(a, b): \xe2\x9c\x93 r\xc3\xa9sum\xc3\xa9<|im_end|>\n";
    std::vector<std::vector<int32_t>> ids;
    for (const spark_tokenizer * t : toks) {
        std::vector<int32_t> v(256);
        int32_t              n = 0;
        REQUIRE(spark_tokenize(t, text.data(), text.size(), true, v.data(), int32_t(v.size()), &n) == SPARK_OK);
        v.resize(size_t(n));
        ids.push_back(v);
    }
    CHECK(ids[0] == ids[1]);
    CHECK(ids[0] == ids[2]);
    CHECK(std::string(spark_tokenizer_chat_template(toks[0])) == spark_tokenizer_chat_template(toks[1]));
    CHECK(spark_tokenizer_eos(toks[1]) == spark_tokenizer_eos(toks[0]));
    CHECK(spark_tokenizer_is_eog(toks[1], spark_tokenizer_find(toks[1], "<|im_end|>")));
    spark_tokenizer_free(standalone);
    std::filesystem::remove(tmp);
}
