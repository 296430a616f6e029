// Byte-level BPE tokenizers (ts::train::Tokenizer, tokenizer.json) encoding and decoding text:
// every rank encodes its own copy at once, as every rank of train_llama --text does, and the
// figure is MB of text per second per rank (the slowest rank's). Each run checks that decoding
// gives the text back. The files are the GPT-2, Llama 3 and SmolLM shaped ones of tests/data, or
// --tokenizer FILE (a model's own); the text is the files given by --text, repeated to --mb MB.
//   mpirun -np 2 tshard_bench_tokenizer --text README.md,docs/architecture.md --mb 8 --reps 3 \
//       --tokenizer tests/data/tokenizer_llama3.json,tests/data/tokenizer_gpt2.json
#include <tshard/train/tokenizer.hpp>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "bench_support.hpp"

namespace {
std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}
}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  std::string texts = "README.md", tokenizers;
  double mb = 8;
  int reps = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--text") texts = v;
    else if (a == "--tokenizer") tokenizers = v;
    else if (a == "--mb") mb = std::atof(v.c_str());
    else if (a == "--reps") reps = std::atoi(v.c_str());
    else {
      if (tshard_bench::world_rank() == 0) std::fprintf(stderr, "tshard_bench_tokenizer: unknown option %s\n", a.c_str());
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
  }
  std::string source;
  for (const auto& path : split_list(texts)) {
    std::ifstream in(path, std::ios::binary);
    source.append(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  if (source.empty()) {
    if (tshard_bench::world_rank() == 0) std::fprintf(stderr, "tshard_bench_tokenizer: no text read from %s\n", texts.c_str());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  std::string text;
  while (double(text.size()) < mb * 1e6) text += source;
  bool all_ok = true;
  if (tshard_bench::world_rank() == 0)
    std::printf("%d ranks, %.2f MB of text each (%s repeated), best of %d\n%-28s %16s %16s %10s\n", tshard_bench::world_size(),
                double(text.size()) / 1e6, texts.c_str(), reps, "tokenizer", "encode MB/s/rank", "decode MB/s/rank", "bytes/id");
  for (const auto& path : split_list(tokenizers)) {
    const auto tok = tshard::train::Tokenizer::from_file(path);
    std::vector<std::int32_t> ids;
    std::string back;
    double encode = 1e300, decode = 1e300;
    for (int r = 0; r < reps; ++r) {
      auto fresh = tok;  // (no word cache carried over from the last rep)
      encode = std::min(encode, tshard_bench::time_once([&] { ids = fresh.encode(text, false); }));
      decode = std::min(decode, tshard_bench::time_once([&] { back = fresh.decode(ids); }));
    }
    const bool ok = tshard_bench::all_ranks(back == text);
    all_ok &= ok;
    if (tshard_bench::world_rank() == 0)
      std::printf("%-28s %16.2f %16.1f %10.2f%s\n", path.substr(path.find_last_of('/') + 1).c_str(), double(text.size()) / encode / 1e6,
                  double(text.size()) / decode / 1e6, double(text.size()) / double(ids.size()), ok ? "" : "  (decode differs: FAILED)");
  }
  MPI_Finalize();
  return all_ok ? 0 : 1;
}
