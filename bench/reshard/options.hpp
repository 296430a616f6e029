// The reshard benchmark's command line (bench/run_reshard.sh passes it through): what to run,
// and the arguments as given, which the output repeats as the command that reproduces it.
#pragma once
#include <mpi.h>

#include <Eigen/Core>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

namespace reshard_bench {

using Index = Eigen::Index;

struct Options {
  Index rows = 4096, cols = 4096;
  int reps = 9, warmup = 2;
  bool hand_datatypes = false;  // --hand datatype
  std::vector<std::string> meshes{"1d"};
  std::vector<std::string> kinds;  // empty: all
  std::string args;                // as given, for the reproduction line
};

inline std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> v;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) v.push_back(item);
  return v;
}

// "S0->R", "S0-R" and "S0R" name the same kind ('>' is awkward on a shell command line).
inline std::string kind_key(const std::string& k) {
  std::string s;
  for (char c : k)
    if (c != '-' && c != '>') s += c;
  return s;
}

[[noreturn]] inline void usage_and_exit(int rank, int code) {
  if (rank == 0)
    std::printf(
        "usage: tshard_bench_reshard [--n N] [--rows N0] [--cols N1] [--reps R>=5] [--warmup W>=2]\n"
        "                            [--mesh 1d,1xP,Px1|all] [--kind K1,K2,...] [--hand pack|datatype]\n"
        "kinds: S0->R S1->R R->S0 R->S1 S0->S1 S1->S0 P->R P->S0 P->S1 (default: all), also\n"
        "       written without '->' (--kind S0R,PS1) so that the shell leaves them alone\n"
        "a float tensor of rows x cols (default 4096 x 4096 = 64 MiB), split over mesh axis x\n"
        "--hand datatype: the hand-written S0->R, S0->S1 and S1->S0 move strided row blocks through\n"
        "                 MPI vector datatypes instead of packing them (even splits only)\n");
  MPI_Finalize();
  std::exit(code);
}

inline Options parse(int argc, char** argv, int rank) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") usage_and_exit(rank, 0);
    if (i + 1 >= argc) usage_and_exit(rank, 2);
    std::string v = argv[++i];
    o.args += " " + a + " " + v;
    if (a == "--n") {
      o.rows = o.cols = std::atol(v.c_str());
    } else if (a == "--rows") {
      o.rows = std::atol(v.c_str());
    } else if (a == "--cols") {
      o.cols = std::atol(v.c_str());
    } else if (a == "--reps") {
      o.reps = std::atoi(v.c_str());
    } else if (a == "--warmup") {
      o.warmup = std::atoi(v.c_str());
    } else if (a == "--mesh") {
      o.meshes = v == "all" ? std::vector<std::string>{"1d", "1xP", "Px1"} : split_list(v);
    } else if (a == "--hand") {
      if (v != "pack" && v != "datatype") usage_and_exit(rank, 2);
      o.hand_datatypes = v == "datatype";
    } else if (a == "--kind") {
      for (auto& k : split_list(v)) o.kinds.push_back(kind_key(k));
    } else {
      if (rank == 0) std::printf("unknown option %s\n", a.c_str());
      usage_and_exit(rank, 2);
    }
  }
  if (o.rows < 1 || o.cols < 1) usage_and_exit(rank, 2);
  if (o.reps < 5) {
    if (rank == 0) std::printf("# --reps %d raised to 5, the least a median is read from\n", o.reps);
    o.reps = 5;
  }
  o.warmup = std::max(o.warmup, 2);
  const std::vector<std::string> known{"S0R", "S1R", "RS0", "RS1", "S0S1", "S1S0", "PR", "PS0", "PS1"};
  for (auto& k : o.kinds)
    if (std::find(known.begin(), known.end(), k) == known.end()) {
      if (rank == 0) std::printf("unknown kind %s\n", k.c_str());
      usage_and_exit(rank, 2);
    }
  for (auto& m : o.meshes)
    if (m != "1d" && m != "1xP" && m != "Px1") {
      if (rank == 0) std::printf("unknown mesh %s\n", m.c_str());
      usage_and_exit(rank, 2);
    }
  return o;
}

}  // namespace reshard_bench
