// Ways one rank can leave the others behind. Each run must end the job non-zero within 40 s with
// a message naming what happened (tests/CMakeLists.txt runs every mode on 3 ranks):
//   return   rank 1 returns from main while the others enter a collective: its finalisation
//            waits a bounded time, then ends the job naming itself
//   exit     the same through std::exit
//   catch    rank 1 catches an exception and returns 1 (the case a new user met)
//   blocked  rank 1 stays busy and never enters; the others' watchdog (TSHARD_TIMEOUT) ends the
//            job naming the collective and the operator
//   complete every rank does the same: exits 0 at once (finalisation's agreement costs nothing)
#include <tshard/tshard.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

namespace ts = tshard;

int main(int argc, char** argv) {
  ts::Environment env(argc, argv);
  const std::string mode = argc > 1 ? argv[1] : "complete";
  const int rank = ts::Environment::world_rank(), leaver = 1 % ts::Environment::world_size();
  if (rank == leaver) {
    if (mode == "return") return 0;
    if (mode == "exit") std::exit(0);
    if (mode == "catch") {
      try {
        throw ts::ShapeError("bad input seen on this rank only");
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d caught: %s\n", rank, e.what());
        return 1;
      }
    }
    if (mode == "blocked") std::this_thread::sleep_for(std::chrono::seconds(600));
  }
  ts::detail::OperatorScope scope("failure_modes");
  const bool ok = ts::agree(true);
  return ok ? 0 : 1;
}
