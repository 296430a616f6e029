// Byte-level BPE tokenizers from tokenizer.json against an independent implementation: the ids and
// texts in tests/data/tokenizer_expected.json were made by HF's tokenizers.js from the files
// tests/reference/make_tokenizers.py writes (GPT-2, Llama 3 and SmolLM shapes; see
// tests/reference/tokenizer_reference.mjs). No MPI.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "tshard/io/json.hpp"
#include "tshard/train/tokenizer.hpp"

namespace ts = tshard;
using ts::io::detail::JsonValue;

namespace {
std::string data_file(const std::string& name) { return std::string(TSHARD_TEST_DATA_DIR) + "/" + name; }
std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}
JsonValue read_json(const std::string& path) {
  const std::string text = read_text(path);
  return ts::io::detail::parse_json(text.data(), text.size(), path);
}
std::vector<std::int32_t> ids_of(const JsonValue& v) {
  std::vector<std::int32_t> out;
  for (const auto& e : v.array) out.push_back(std::int32_t(e.integer));
  return out;
}
// kind's tokenizer.json with `edit` applied to its JSON text.
ts::train::Tokenizer edited(const std::string& kind, const std::string& from, const std::string& to) {
  std::string text = read_text(data_file("tokenizer_" + kind + ".json"));
  const auto at = text.find(from);
  REQUIRE(at != std::string::npos);
  text.replace(at, from.size(), to);
  return ts::train::Tokenizer(text, kind + " (edited)");
}
std::string error_of(const std::string& json) {
  try {
    ts::train::Tokenizer(json, "t.json");
  } catch (const ts::IoError& e) {
    return e.what();
  }
  return "no error";
}
const char* kBpe = R"("model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]})";
}  // namespace

TEST_CASE("encode and decode equal HF's on GPT-2, Llama 3 and SmolLM shaped tokenizer.json files", "[tokenizer]") {
  const JsonValue texts = read_json(data_file("tokenizer_texts.json"));
  const JsonValue expected = read_json(data_file("tokenizer_expected.json"));
  for (const std::string kind : {"gpt2", "prefix", "llama3", "smollm"}) {
    auto tok = ts::train::Tokenizer::from_file(data_file("tokenizer_" + kind + ".json"));
    auto clean = tok;
    clean.set_clean_up_tokenization_spaces(true);
    const JsonValue& want = *expected.find(kind);
    REQUIRE(want.array.size() == texts.array.size());
    for (std::size_t i = 0; i < texts.array.size(); ++i) {
      const std::string& text = texts.array[i].string;
      const JsonValue& w = want.array[i];
      INFO(kind << " text " << i << ": " << ts::io::detail::json_quote(text));
      const auto ids = tok.encode(text);
      CHECK(ids == ids_of(*w.find("ids")));
      CHECK(tok.encode(text, false) == ids_of(*w.find("ids_no_special")));
      CHECK(tok.decode(ids) == w.find("decoded")->string);
      CHECK(tok.decode(ids, true) == w.find("decoded_skip_special")->string);
      CHECK(clean.decode(ids) == w.find("decoded_clean")->string);
    }
  }
}

std::size_t static_init_regex_matches();  // (static_init_regex.cpp)

TEST_CASE("a UnicodeRegex made in static initialisation, in a translation unit without PCRE2, finds the engine",
          "[tokenizer]") {
  CHECK(static_init_regex_matches() == 2);
}

TEST_CASE("text with non-ASCII letters and digits round-trips through encode and decode", "[tokenizer]") {
  const std::string text = "Grüße, Καλημέρα, Привет, 東京 2024-11-27 ½ 🙂\n\tend  ";
  for (const std::string kind : {"gpt2", "prefix", "llama3", "smollm"}) {
    const auto tok = ts::train::Tokenizer::from_file(data_file("tokenizer_" + kind + ".json"));
    const std::string back = tok.decode(tok.encode(text, false));
    CHECK(back == (kind == "prefix" ? " " + text : text));  // (a prefix space is part of the text then)
  }
}

TEST_CASE("merges written as \"a b\" and as [\"a\", \"b\"] give one tokenizer", "[tokenizer]") {
  const JsonValue texts = read_json(data_file("tokenizer_texts.json"));
  // The Llama 3 file holds pairs; the same merges as strings (no merge token holds a space).
  std::string text = read_text(data_file("tokenizer_llama3.json"));
  const JsonValue root = ts::io::detail::parse_json(text.data(), text.size(), "llama3");
  std::string strings = "\"merges\": [";
  const JsonValue& merges = *root.find("model")->find("merges");
  for (std::size_t r = 0; r < merges.array.size(); ++r)
    strings += (r ? ", " : "") + ts::io::detail::json_quote(merges.array[r].array[0].string + " " + merges.array[r].array[1].string);
  const auto at = text.find("\"merges\": [");
  const auto end = text.find("\n  ]\n }", at);  // (the file's indentation: the list, then the model, close)
  REQUIRE((at != std::string::npos && end != std::string::npos));
  text.replace(at, end + 4 - at, strings + "]");
  const ts::train::Tokenizer pairs = ts::train::Tokenizer::from_file(data_file("tokenizer_llama3.json")), as_strings(text, "strings");
  for (const auto& t : texts.array) CHECK(pairs.encode(t.string) == as_strings.encode(t.string));
}

TEST_CASE("ignore_merges takes a word the vocabulary holds whole, whatever the merges", "[tokenizer]") {
  // "ab" is in the vocabulary, but no merge makes it: merging gives a, b; ignore_merges gives ab.
  const std::string model = R"("model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "c": 3}, "merges": [], "ignore_merges": )";
  const ts::train::Tokenizer merging("{" + model + "false}}", "m"), whole("{" + model + "true}}", "w");
  CHECK(merging.encode("ab") == std::vector<std::int32_t>{0, 1});
  CHECK(whole.encode("ab") == std::vector<std::int32_t>{2});
  CHECK(whole.encode("abc") == std::vector<std::int32_t>{0, 1, 3});
}

TEST_CASE("decoding a cut multi-byte character gives U+FFFD, as HF's lossy decoding", "[tokenizer]") {
  const auto tok = ts::train::Tokenizer::from_file(data_file("tokenizer_gpt2.json"));
  const auto ids = tok.encode("ü", false);  // two byte tokens: 0xC3 0xBC
  REQUIRE(ids.size() == 2);
  CHECK(tok.decode({ids[0]}) == "\xef\xbf\xbd");
  CHECK(tok.decode({ids[0], ids[0], ids[1]}) == "\xef\xbf\xbd\xc3\xbc");
  CHECK(tok.vocab_size() == 560);  // 556 model tokens and 4 added
  CHECK(tok.token_to_id("<|eot_id|>") == 558);
}

TEST_CASE("what a tokenizer.json holds that tshard does not implement is one error naming it", "[tokenizer]") {
  CHECK_THAT(error_of("{" + std::string(kBpe) + R"(, "pre_tokenizer": {"type": "Metaspace"}})"),
             Catch::Contains("t.json: pre_tokenizer \"Metaspace\" is not supported"));
  CHECK_THAT(error_of("{" + std::string(kBpe) + R"(, "normalizer": {"type": "Lowercase"}})"),
             Catch::Contains("normalizer \"Lowercase\" is not supported"));
  CHECK_THAT(error_of("{" + std::string(kBpe) + R"(, "decoder": {"type": "WordPiece"}})"), Catch::Contains("decoder \"WordPiece\" is not supported"));
  CHECK_THAT(error_of("{" + std::string(kBpe) + R"(, "post_processor": {"type": "Foo"}})"), Catch::Contains("post_processor \"Foo\" is not supported"));
  CHECK_THAT(error_of(R"({"model": {"type": "WordPiece", "vocab": {}}})"), Catch::Contains("model type \"WordPiece\" is not supported"));
  CHECK_THAT(error_of(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}})"),
             Catch::Contains("merge 0 (\"a\" \"b\") names a token the vocabulary lacks"));
  CHECK_THAT(error_of(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b c"]}})"),
             Catch::Contains("merges[0] is not two tokens separated by one space"));
  CHECK_THAT(error_of(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "continuing_subword_prefix": "##"}})"),
             Catch::Contains("model.continuing_subword_prefix is not supported"));
  CHECK_THAT(error_of("{" + std::string(kBpe) + R"(, "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(["}, "behavior": "Isolated"}})"),
             Catch::Contains("pre_tokenizer.pattern: the pattern does not compile"));
  CHECK_THAT(error_of("{\"model\": "), Catch::Contains("t.json is not valid JSON"));
  CHECK_THAT(error_of("{}"), Catch::Contains("t.json: the file has no \"model\""));

  const auto tok = ts::train::Tokenizer::from_file(data_file("tokenizer_gpt2.json"));
  CHECK(tok.decode({9999, tok.encode("ok", false)[0]}) == "o");  // an id no vocabulary has is left out, as HF does
  CHECK_THROWS_WITH(tok.encode("ok \xc3("), Catch::Contains("the text is not valid UTF-8 at byte 3"));
  CHECK_THROWS_WITH(ts::train::Tokenizer::from_file("/nonexistent/tokenizer.json"), Catch::Contains("cannot open /nonexistent/tokenizer.json"));
  // NFC and NFKC are implemented where they change nothing (below U+0300 and U+00A0): other text
  // is an error, never a silent difference from HF.
  const auto nfc = edited("gpt2", "\"normalizer\": null", "\"normalizer\": {\"type\": \"NFC\"}");
  const auto nfkc = edited("gpt2", "\"normalizer\": null", "\"normalizer\": {\"type\": \"NFKC\"}");
  CHECK(nfc.encode("Grüße, plain") == tok.encode("Grüße, plain"));
  CHECK(nfkc.encode("plain text") == tok.encode("plain text"));
  CHECK_THROWS_WITH(nfc.encode("e\xcc\x81"), Catch::Contains("normalizer NFC is implemented where it changes nothing (code points below U+0300)"));
  CHECK_THROWS_WITH(nfkc.encode("\xc2\xbd"), Catch::Contains("normalizer NFKC is implemented where it changes nothing (code points below U+00A0)"));
}

TEST_CASE("Split behaviors and invert cut text as HF's SplitDelimiterBehavior", "[tokenizer]") {
  // Each character its own token: the pieces show as the ids the model gives them, one per byte.
  std::string vocab;
  for (char c : std::string("ab-")) vocab += std::string(vocab.empty() ? "" : ", ") + "\"" + c + "\": " + std::to_string(int(c));
  auto pieces = [&](const std::string& behavior, bool invert) {
    // with merges a+b -> "ab" (id 1): a piece "ab" becomes one id, "a" and "b" apart stay two
    const std::string json = R"({"model": {"type": "BPE", "vocab": {)" + vocab + R"(, "ab": 1, "a-": 2, "-b": 3, "--": 4},
      "merges": ["a b", "a -", "- b", "- -"]}, "pre_tokenizer": {"type": "Split", "pattern": {"String": "-"}, "behavior": ")" +
                             behavior + "\", \"invert\": " + (invert ? "true" : "false") + "}}";
    return ts::train::Tokenizer(json, behavior).encode("ab-a--b");
  };
  using V = std::vector<std::int32_t>;
  CHECK(pieces("Removed", false) == V{1, 'a', 'b'});             // ab | a | b
  CHECK(pieces("Isolated", false) == V{1, '-', 'a', '-', '-', 'b'});  // ab - a - - b
  CHECK(pieces("MergedWithPrevious", false) == V{1, '-', 2, '-', 'b'});  // ab- a- - b  ("ab-": ab then -)
  CHECK(pieces("MergedWithNext", false) == V{1, '-', 'a', '-', 3});  // ab -a - -b  ("-a": no merge)
  CHECK(pieces("Contiguous", false) == V{1, '-', 'a', 4, 'b'});  // ab - a -- b
  CHECK(pieces("Removed", true) == V{'-', '-', '-'});            // the matches kept, each apart: - - -
}
