// The definitions of tokenizer.hpp (included at its end, or compiled once in tshard::kernels).
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "tshard/train/tokenizer.hpp"

namespace tshard::train {

TSHARD_FUNC Tokenizer Tokenizer::from_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError("tshard::train::Tokenizer: cannot open " + path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return Tokenizer(text, path);
}

TSHARD_FUNC Tokenizer::Tokenizer(std::string_view json, const std::string& what) : what_("tshard::train::Tokenizer: " + what) {
  const io::detail::JsonValue root = io::detail::parse_json(json.data(), json.size(), what);
  if (!root.is_object()) fail("the file is not a JSON object");
  read_model(member(root, "model", "the file"));
  if (const auto* added = root.find("added_tokens"); added && added->kind != Kind::Null) read_added_tokens(*added);
  read_normalizer(root.find("normalizer"));
  if (const auto* pre = root.find("pre_tokenizer")) read_pre_tokenizer(*pre, "pre_tokenizer");
  if (const auto* post = root.find("post_processor")) read_post_processor(*post, "post_processor");
  if (const auto* decoder = root.find("decoder")) read_decoder(*decoder, "decoder");
}

TSHARD_FUNC std::vector<std::int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  if (const std::size_t bad = detail::first_invalid_utf8(text); bad != std::string_view::npos)
    throw IoError(what_ + ": the text is not valid UTF-8 at byte " + std::to_string(bad));
  std::vector<std::int32_t> ids;
  std::size_t at = 0;
  for (const auto& [begin, end, id] : added_token_matches(text)) {
    encode_segment(text.substr(at, begin - at), ids);
    ids.push_back(id);
    at = end;
  }
  encode_segment(text.substr(at), ids);
  return add_special_tokens ? post_process(std::move(ids)) : ids;
}

TSHARD_FUNC std::string Tokenizer::decode(const std::vector<std::int32_t>& ids, bool skip_special_tokens) const {
  std::string bytes;
  std::vector<std::string> joined;  // without a decoder, tokens joined by spaces
  for (const std::int32_t id : ids) {
    if (const auto it = added_by_id_.find(id); it != added_by_id_.end()) {
      const AddedToken& t = added_[it->second];
      if (skip_special_tokens && t.special) continue;
      if (!decoder_byte_level_) joined.push_back(t.content);
      else bytes += detail::ByteAlphabet::get().decode(t.content);
      continue;
    }
    const std::string* token = model_.id_to_token(id);
    if (!token) continue;
    if (!decoder_byte_level_) joined.push_back(*token);
    else bytes += detail::ByteAlphabet::get().decode(*token);
  }
  if (!decoder_byte_level_)
    for (std::size_t i = 0; i < joined.size(); ++i) bytes += (i ? " " : "") + joined[i];
  std::string text = detail::utf8_lossy(bytes);
  return clean_up_spaces_ ? clean_up_tokenization_spaces(std::move(text)) : text;
}

TSHARD_FUNC std::size_t Tokenizer::vocab_size() const {
  std::size_t n = model_.id_bound();
  for (const auto& t : added_) n = std::max(n, std::size_t(t.id) + 1);
  return n;
}

TSHARD_FUNC std::optional<std::int32_t> Tokenizer::token_to_id(const std::string& token) const {
  for (const auto& t : added_)
    if (t.content == token) return t.id;
  return model_.token_to_id(token);
}

TSHARD_FUNC const Tokenizer::Json& Tokenizer::member(const Json& object, const std::string& key, const std::string& where) const {
  const Json* v = object.is_object() ? object.find(key) : nullptr;
  if (!v) fail(where + " has no \"" + key + "\"");
  return *v;
}

TSHARD_FUNC const std::string& Tokenizer::string_member(const Json& object, const std::string& key,
                                                        const std::string& where) const {
  const Json& v = member(object, key, where);
  if (v.kind != Kind::String) fail(where + "." + key + " is not a string");
  return v.string;
}

TSHARD_FUNC bool Tokenizer::flag(const Json& object, const std::string& key, bool otherwise) const {
  const Json* v = object.find(key);
  if (!v || v->kind == Kind::Null) return otherwise;
  if (v->kind != Kind::Bool) fail("\"" + key + "\" is not true or false");
  return v->boolean;
}

TSHARD_FUNC std::int32_t Tokenizer::id_of(const Json& v, const std::string& where) const {
  if (v.kind != Kind::Number || !v.integral || v.integer < 0 || v.integer >= (1 << 26))
    fail(where + " is not a token id (an integer from 0 to 2^26)");
  return std::int32_t(v.integer);
}

TSHARD_FUNC std::int32_t Tokenizer::id_of_token(const std::string& token, const std::string& where) const {
  const auto id = token_to_id(token);
  if (!id) fail(where + " names the token \"" + token + "\", which the tokenizer lacks");
  return *id;
}

TSHARD_FUNC void Tokenizer::read_model(const Json& model) {
  if (!model.is_object()) fail("model is not an object");
  if (const Json* type = model.find("type"); type && !(type->kind == Kind::String && type->string == "BPE"))
    fail("model type \"" + (type->kind == Kind::String ? type->string : std::string("?")) + "\" is not supported (only BPE)");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (const Json* v = model.find(key); v && !(v->kind == Kind::Null || (v->kind == Kind::String && v->string.empty())))
      fail(std::string("model.") + key + " is not supported");
  if (const Json* d = model.find("dropout"); d && d->kind != Kind::Null && !(d->kind == Kind::Number && d->number == 0))
    fail("model.dropout is not supported (encoding would not be deterministic)");
  const Json& vocab = member(model, "vocab", "model");
  if (!vocab.is_object()) fail("model.vocab is not an object");
  std::unordered_map<std::string, std::int32_t> ids;
  ids.reserve(vocab.keys.size());
  for (std::size_t i = 0; i < vocab.keys.size(); ++i) ids[vocab.keys[i]] = id_of(vocab.members[i], "model.vocab[\"" + vocab.keys[i] + "\"]");
  std::vector<std::pair<std::string, std::string>> merges;
  if (const Json* m = model.find("merges"); m && m->kind != Kind::Null) {
    if (m->kind != Kind::Array) fail("model.merges is not an array");
    merges.reserve(m->array.size());
    for (std::size_t r = 0; r < m->array.size(); ++r) {
      const Json& e = m->array[r];
      if (e.kind == Kind::String) {  // "a b"
        const std::size_t space = e.string.find(' ');
        if (space == std::string::npos || e.string.find(' ', space + 1) != std::string::npos)
          fail("model.merges[" + std::to_string(r) + "] is not two tokens separated by one space");
        merges.emplace_back(e.string.substr(0, space), e.string.substr(space + 1));
      } else if (e.kind == Kind::Array && e.array.size() == 2 && e.array[0].kind == Kind::String && e.array[1].kind == Kind::String) {
        merges.emplace_back(e.array[0].string, e.array[1].string);  // ["a", "b"]
      } else {
        fail("model.merges[" + std::to_string(r) + "] is neither \"a b\" nor [\"a\", \"b\"]");
      }
    }
  }
  BpeOptions options;
  if (const Json* unk = model.find("unk_token"); unk && unk->kind == Kind::String) options.unk_token = unk->string;
  options.fuse_unk = flag(model, "fuse_unk", false);
  options.byte_fallback = flag(model, "byte_fallback", false);
  options.ignore_merges = flag(model, "ignore_merges", false);
  model_ = BpeModel(std::move(ids), merges, std::move(options), what_);
}

TSHARD_FUNC void Tokenizer::read_added_tokens(const Json& list) {
  if (list.kind != Kind::Array) fail("added_tokens is not an array");
  for (std::size_t i = 0; i < list.array.size(); ++i) {
    const Json& e = list.array[i];
    const std::string where = "added_tokens[" + std::to_string(i) + "]";
    AddedToken t;
    t.id = id_of(member(e, "id", where), where + ".id");
    t.content = string_member(e, "content", where);
    if (t.content.empty()) continue;  // (never matches: HF skips it too)
    t.single_word = flag(e, "single_word", false), t.lstrip = flag(e, "lstrip", false), t.rstrip = flag(e, "rstrip", false);
    t.special = flag(e, "special", false);
    added_by_id_[t.id] = added_.size();
    added_.push_back(std::move(t));
  }
  for (std::size_t k = 0; k < added_.size(); ++k) added_by_first_byte_[static_cast<unsigned char>(added_[k].content[0])].push_back(k);
  for (auto& list : added_by_first_byte_)
    std::stable_sort(list.begin(), list.end(), [&](std::size_t a, std::size_t b) { return added_[a].content.size() > added_[b].content.size(); });
}

TSHARD_FUNC void Tokenizer::read_normalizer(const Json* n) {
  if (!n || n->kind == Kind::Null) return;
  const std::string& type = string_member(*n, "type", "normalizer");
  if (type == "Sequence") {
    for_each_element(*n, "normalizers", "normalizer", [&](const Json& e, const std::string&) { read_normalizer(&e); });
  } else if (type == "NFC" || type == "NFKC") {  // the identity below U+0300 (NFC) or U+00A0 (NFKC); above, an error
    normalizer_ = type;
    normalizer_identity_below_ = type == "NFC" ? 0x300 : 0xa0;
  } else {
    fail("normalizer \"" + type + "\" is not supported");
  }
}

TSHARD_FUNC void Tokenizer::read_pre_tokenizer(const Json& p, const std::string& where) {
  if (p.kind == Kind::Null) return;
  const std::string& type = string_member(p, "type", where);
  PreTokenizerStep step{};
  if (type == "Sequence") {
    for_each_element(p, "pretokenizers", where, [&](const Json& e, const std::string& at) { read_pre_tokenizer(e, at); });
    return;
  } else if (type == "ByteLevel") {
    step.kind = PreTokenizerStep::Kind::ByteLevel;
    step.add_prefix_space = flag(p, "add_prefix_space", false), step.use_regex = flag(p, "use_regex", true);
    if (step.use_regex) step.regex.emplace(kGpt2Pattern, what_ + ": " + where + " (GPT-2's pattern)");
  } else if (type == "Split") {
    step.kind = PreTokenizerStep::Kind::Split;
    const Json& pattern = member(p, "pattern", where);
    if (const Json* re = pattern.find("Regex"); re && re->kind == Kind::String) step.regex.emplace(re->string, what_ + ": " + where + ".pattern");
    else if (const Json* s = pattern.find("String"); s && s->kind == Kind::String && !s->string.empty()) step.literal = s->string;
    else fail(where + ".pattern is neither {\"Regex\": ...} nor {\"String\": ...}");
    const std::string& behavior = string_member(p, "behavior", where);
    const char* names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    bool known = false;
    for (int b = 0; b < 5; ++b)
      if (behavior == names[b]) step.behavior = Behavior(b), known = true;
    if (!known) fail(where + ".behavior \"" + behavior + "\" is not a split behavior");
    step.invert = flag(p, "invert", false);
  } else if (type == "Digits") {  // (Rust's char::is_numeric: Unicode's N)
    step.kind = PreTokenizerStep::Kind::Digits;
    step.individual_digits = flag(p, "individual_digits", false);
    step.regex.emplace(R"(\p{N})", what_ + ": " + where + " (Unicode digits)");
  } else {
    fail(where + " \"" + type + "\" is not supported (ByteLevel, Split, Digits and Sequence are)");
  }
  pre_.push_back(std::move(step));
}

TSHARD_FUNC void Tokenizer::read_post_processor(const Json& p, const std::string& where) {
  if (p.kind == Kind::Null) return;
  const std::string& type = string_member(p, "type", where);
  if (type == "Sequence") {
    for_each_element(p, "processors", where, [&](const Json& e, const std::string& at) { read_post_processor(e, at); });
  } else if (type == "ByteLevel") {  // (offsets only)
  } else if (type == "TemplateProcessing") {
    if (!template_.empty()) fail(where + ": a second template");
    const Json& single = member(p, "single", where);
    if (single.kind != Kind::Array) fail(where + ".single is not an array");
    const Json* specials = p.find("special_tokens");
    for (const Json& piece : single.array) {
      if (piece.find("Sequence")) {
        template_.push_back({true, {}});
      } else if (const Json* t = piece.find("SpecialToken")) {
        const std::string& name = string_member(*t, "id", where + ".single[].SpecialToken");
        const Json* entry = specials && specials->is_object() ? specials->find(name) : nullptr;
        TemplatePiece tp;
        if (entry && entry->find("ids") && entry->find("ids")->kind == Kind::Array)
          for (const Json& id : entry->find("ids")->array) tp.ids.push_back(id_of(id, where + ".special_tokens[\"" + name + "\"].ids"));
        else
          tp.ids.push_back(id_of_token(name, where));
        template_.push_back(std::move(tp));
      } else {
        fail(where + ".single holds a piece that is neither Sequence nor SpecialToken");
      }
    }
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {  // cls, the sequence, sep
    if (!template_.empty()) fail(where + ": a second template");
    auto token = [&](const char* key) {
      const Json& v = member(p, key, where);
      if (v.kind != Kind::Array || v.array.size() != 2) fail(where + "." + key + " is not [token, id]");
      return id_of(v.array[1], where + "." + key);
    };
    template_ = {{false, {token("cls")}}, {true, {}}, {false, {token("sep")}}};
  } else {
    fail(where + " \"" + type + "\" is not supported (TemplateProcessing, RobertaProcessing, BertProcessing, ByteLevel "
         "and Sequence are)");
  }
}

TSHARD_FUNC void Tokenizer::read_decoder(const Json& d, const std::string& where) {
  if (d.kind == Kind::Null) return;
  const std::string& type = string_member(d, "type", where);
  if (type == "Sequence") {
    for_each_element(d, "decoders", where, [&](const Json& e, const std::string& at) { read_decoder(e, at); });
  } else if (type == "ByteLevel") {
    decoder_byte_level_ = true;
  } else {
    fail(where + " \"" + type + "\" is not supported (ByteLevel and Sequence are)");
  }
}

TSHARD_FUNC std::vector<std::tuple<std::size_t, std::size_t, std::int32_t>> Tokenizer::added_token_matches(std::string_view text) const {
  std::vector<std::tuple<std::size_t, std::size_t, std::int32_t>> out;
  if (added_.empty()) return out;
  std::size_t taken = 0;  // the end of the last match (lstrip takes no byte before it)
  for (std::size_t i = 0; i < text.size();) {
    const AddedToken* best = nullptr;
    for (const std::size_t k : added_by_first_byte_[static_cast<unsigned char>(text[i])])
      if (text.compare(i, added_[k].content.size(), added_[k].content) == 0) {
        best = &added_[k];
        break;
      }
    if (!best) {
      ++i;
      continue;
    }
    std::size_t begin = i, end = i + best->content.size();
    i = end;
    if (best->single_word && ((begin > 0 && word_byte(text[begin - 1])) || (end < text.size() && word_byte(text[end])))) continue;
    if (best->lstrip)
      for (std::size_t before; begin > taken && white_space(detail::code_point_at(text, before = detail::character_before(text, begin)));)
        begin = before;
    if (best->rstrip)
      while (end < text.size() && white_space(detail::code_point_at(text, end)))
        end += detail::utf8_length(static_cast<unsigned char>(text[end]));
    out.emplace_back(begin, end, best->id);
    taken = i = end;
  }
  return out;
}

TSHARD_FUNC bool Tokenizer::white_space(std::uint32_t c) {
  return (c >= 0x9 && c <= 0xd) || c == 0x20 || c == 0x85 || c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) ||
         c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

TSHARD_FUNC bool Tokenizer::word_byte(char c) {
  const auto u = static_cast<unsigned char>(c);
  return u >= 0x80 || (u >= '0' && u <= '9') || (u >= 'a' && u <= 'z') || (u >= 'A' && u <= 'Z') || u == '_';
}

TSHARD_FUNC void Tokenizer::encode_segment(std::string_view text, std::vector<std::int32_t>& ids) const {
  if (text.empty()) return;
  if (!normalizer_.empty())
    for (std::size_t i = 0; i < text.size(); i += detail::utf8_length(static_cast<unsigned char>(text[i])))
      if (detail::code_point_at(text, i) >= normalizer_identity_below_)
        fail("normalizer " + normalizer_ + " is implemented where it changes nothing (code points below U+" +
             (normalizer_ == "NFC" ? std::string("0300") : std::string("00A0")) + "), and the text has one above");
  std::vector<std::string> pieces{std::string(text)};
  for (const auto& step : pre_) {
    std::vector<std::string> next;
    for (const auto& piece : pieces) split(step, piece, next);
    pieces = std::move(next);
  }
  for (const auto& word : pieces) model_.encode_word(word, ids);
}

TSHARD_FUNC void Tokenizer::split(const PreTokenizerStep& step, std::string piece,
                                  std::vector<std::string>& out) const {
  using K = PreTokenizerStep::Kind;
  if (step.kind == K::ByteLevel) {  // (a prefix space on every piece, as HF's split callback)
    if (step.add_prefix_space && (piece.empty() || piece[0] != ' ')) piece.insert(piece.begin(), ' ');
    const auto& alphabet = detail::ByteAlphabet::get();
    if (!step.use_regex) return out.push_back(alphabet.encode(piece));
    std::vector<std::string> words;
    split_by(piece, step.regex->find_all(piece), Behavior::Isolated, false, words);
    for (const auto& w : words) out.push_back(alphabet.encode(w));
    return;
  }
  std::vector<std::pair<std::size_t, std::size_t>> matches;
  Behavior behavior = Behavior::Isolated;
  bool invert = false;
  if (step.kind == K::Digits) {  // each digit a match: apart, or runs joined
    behavior = step.individual_digits ? Behavior::Isolated : Behavior::Contiguous;
    matches = step.regex->find_all(piece);
  } else {
    behavior = step.behavior, invert = step.invert;
    if (step.regex) {
      matches = step.regex->find_all(piece);
    } else {
      for (std::size_t at = piece.find(step.literal); at != std::string::npos; at = piece.find(step.literal, at + step.literal.size()))
        matches.emplace_back(at, at + step.literal.size());
    }
  }
  split_by(piece, matches, behavior, invert, out);
}

TSHARD_FUNC void Tokenizer::split_by(const std::string& piece,
                                     const std::vector<std::pair<std::size_t, std::size_t>>& matches,
                                     Behavior behavior, bool invert, std::vector<std::string>& out) {
  std::vector<std::pair<std::string_view, bool>> parts;  // (text, is a delimiter)
  const std::string_view s(piece);
  std::size_t at = 0;
  for (const auto& [b, e] : matches) {
    if (b > at) parts.emplace_back(s.substr(at, b - at), invert);
    parts.emplace_back(s.substr(b, e - b), !invert);
    at = e;
  }
  if (at < s.size()) parts.emplace_back(s.substr(at), invert);
  std::vector<std::string> result;
  bool last_delimiter = false;
  for (const auto& [text, delimiter] : parts) {
    switch (behavior) {
      case Behavior::Removed:
        if (!delimiter) result.emplace_back(text);
        break;
      case Behavior::Isolated:
        result.emplace_back(text);
        break;
      case Behavior::MergedWithPrevious:
        if (delimiter && !result.empty() && !last_delimiter) result.back() += text;
        else result.emplace_back(text);
        break;
      case Behavior::MergedWithNext:
        if (last_delimiter && !delimiter) result.back() += text;  // a delimiter joins the part after it
        else result.emplace_back(text);
        break;
      case Behavior::Contiguous:  // (HF joins neighbours alike, delimiters or not)
        if (!result.empty() && delimiter == last_delimiter) result.back() += text;
        else result.emplace_back(text);
        break;
    }
    last_delimiter = delimiter;
  }
  for (auto& r : result)
    if (!r.empty()) out.push_back(std::move(r));
}

TSHARD_FUNC std::string Tokenizer::clean_up_tokenization_spaces(std::string text) {
  static const std::pair<const char*, const char*> rules[] = {{" .", "."},   {" ?", "?"},   {" !", "!"},     {" ,", ","},
                                                              {" ' ", "'"},  {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"},
                                                              {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : rules) {
    std::string out;
    const std::string_view f(from);
    std::size_t at = 0;
    for (std::size_t hit = text.find(f); hit != std::string::npos; hit = text.find(f, at)) out.append(text, at, hit - at).append(to), at = hit + f.size();
    text = out.append(text, at, std::string::npos);
  }
  return text;
}

TSHARD_FUNC std::vector<std::int32_t> Tokenizer::post_process(std::vector<std::int32_t> ids) const {
  if (template_.empty()) return ids;
  std::vector<std::int32_t> out;
  out.reserve(ids.size() + 4);
  for (const auto& piece : template_) out.insert(out.end(), piece.sequence ? ids.begin() : piece.ids.begin(), piece.sequence ? ids.end() : piece.ids.end());
  return out;
}

}  // namespace tshard::train
