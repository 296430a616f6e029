// The one main of every MPI test binary: owns MPI, runs Catch on every rank, and makes sure a
// failure anywhere fails the run everywhere, quickly:
//  - tests check collectively (TS_REQUIRE_ALL) where they go on into collectives;
//  - a watchdog ends the job with MPI_Abort and a message when a run outlives its budget
//    (a rank left waiting in a collective another rank never entered);
//  - the exit code is agreed on by all ranks.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>

#include "tshard/comm/environment.hpp"

namespace {

std::mutex g_mutex;
std::condition_variable g_cv;
bool g_done = false;
std::string g_current_test = "(none)";

struct CurrentTestListener : Catch::TestEventListenerBase {
  using TestEventListenerBase::TestEventListenerBase;
  void testCaseStarting(Catch::TestCaseInfo const& info) override {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_current_test = info.name;
  }
};

void watchdog(double seconds) {
  std::unique_lock<std::mutex> lock(g_mutex);
  if (g_cv.wait_for(lock, std::chrono::duration<double>(seconds), [] { return g_done; })) return;
  std::string msg = "watchdog: the test run exceeded " + std::to_string(int(seconds)) +
                    " s (a rank is probably waiting in a collective another rank left); last test case: " +
                    g_current_test;
  lock.unlock();
  tshard::detail::abort_job(msg.c_str());
}

}  // namespace

CATCH_REGISTER_LISTENER(CurrentTestListener)

int main(int argc, char** argv) {
  tshard::Environment env(argc, argv);
  const int rank = tshard::Environment::world_rank();
  double budget = 100;
  if (const char* s = std::getenv("TSHARD_TEST_WATCHDOG")) budget = std::atof(s);
#if TSHARD_SIMULATE
  // Simulated ranks share one process: no thread of ours may call into the simulator (it ends a
  // deadlocked run itself), and std::cout is every rank's, so the other ranks' reports go nowhere;
  // their failures still fail the run through the agreed exit code.
  (void)budget;
  (void)&watchdog;
  Catch::Session session;
  session.configData().useColour = Catch::UseColour::No;
  int rc = session.applyCommandLine(argc, argv);
  if (rank != 0) session.configData().outputFilename = "/dev/null";
  if (rc == 0) rc = session.run();
  return tshard::agree(rc == 0) ? 0 : 1;
#else
  std::thread dog(watchdog, budget);

  // Rank 0 reports; other ranks keep their report and print it only when they failed.
  std::ostringstream captured;
  std::streambuf* old = nullptr;
  if (rank != 0) old = std::cout.rdbuf(captured.rdbuf());

  Catch::Session session;
  session.configData().useColour = Catch::UseColour::No;
  int rc = session.applyCommandLine(argc, argv);
  if (rc == 0) rc = session.run();

  if (old) std::cout.rdbuf(old);
  if (rank != 0 && rc != 0) std::cerr << "---- rank " << rank << " report ----\n" << captured.str() << std::flush;

  const bool all_ok = tshard::agree(rc == 0);
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_done = true;
  }
  g_cv.notify_all();
  dog.join();
  return all_ok ? 0 : 1;
#endif
}
