// The machines scripts/simulate.sh simulates, by name (--platform), each with the figures it was
// calibrated from. smpirun loads this file's shared object in place of an XML platform: an XML
// <cluster> gives every transfer inside a node a loopback link to itself, but a node's ranks share
// one memory system, so here each node has one shared link that all its intra-node transfers
// cross. Between nodes: a non-blocking two-level fat tree (16 nodes a leaf switch, each leaf with
// one uplink to each of 16 spine switches), every node on one link of the network's bandwidth.
//
// scripts/simulate.sh sets, from its own options:
//   TSHARD_SIM_PLATFORM     vm, xeon-node, xeon-cluster or xeon-ethernet
//   TSHARD_SIM_NODES        how many nodes (1 for vm and xeon-node; up to 256, 16 or fewer or a
//                           multiple of 16, for the clusters)
//   TSHARD_SIM_HOST_FLOPS   this machine's measured sgemm rate, the vm's core speed
#include <simgrid/s4u.hpp>

// (smpicxx puts SMPI's helpers before every file: exit() there ends one simulated rank, and this
// code runs before any.)
#undef exit

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace sg4 = simgrid::s4u;

namespace {

struct Platform {
  const char* name;
  int max_nodes;
  int cores;            // ranks a node runs, one a core
  double core_flops;    // a core's sgemm rate with every core of the node busy; 0: this machine's
  double memory_bw;     // bytes/s all of a node's intra-node transfers share
  double memory_lat;    // seconds, an intra-node message's
  double network_bw;    // bytes/s of a node's link (and of every switch link)
  double network_lat;   // seconds a hop
};

constexpr Platform platforms[] = {
    // This 2-core VM. Cores: this machine's own measured sgemm rate (simulate.sh), so simulated
    // compute takes what it takes here. Shared memory as the suite runs Open MPI
    // (btl_vader_single_copy_mechanism=none): 0.4 us ping-pong (FACTS.md). Its bandwidth is what
    // both ranks exchanging at once get with buffers past the caches, as gradients are (17 GB/s
    // one way at 1 MiB, cache to cache): 3.2-3.5 GB/s each way per rank in the 2-rank all-reduce
    // of 16-64 MB (bench/run_all_reduce.sh), which takes 8.5 GB/s here to reproduce.
    {"vm", 1, 2, 0, 8.5e9, 0.4e-6, 8.5e9, 0.4e-6},
    // The 16-core Xeon node (FACTS.md, measured 2026-11-26): sgemm n=384 102-150 GFLOP/s a core
    // alone and 20-25 % less with 16 busy, hence 100; triad 111 GB/s over 16 ranks. The memory
    // link's 28 GB/s is what makes a 16-rank ring all-reduce of 112 MB take the measured 118 ms:
    // 16 x 2 (15/16) x 112 MB = 3.4 GB through it; simulated, that all-reduce takes 131-133 ms
    // (docs/scaling.md).
    {"xeon-node", 1, 16, 100e9, 28e9, 0.3e-6, 28e9, 0.3e-6},
    // Up to 256 such nodes on 200 Gb/s (25 GB/s) links, 1.5 us a hop: an InfiniBand HDR class.
    {"xeon-cluster", 256, 16, 100e9, 28e9, 0.3e-6, 25e9, 1.5e-6},
    // The same nodes on 25 Gb/s Ethernet, ~10 us a hop.
    {"xeon-ethernet", 256, 16, 100e9, 28e9, 0.3e-6, 3.125e9, 10e-6},
};

[[noreturn]] void fail(const std::string& why) {
  std::fprintf(stderr, "tshard platforms: %s\n", why.c_str());
  std::exit(2);
}

const Platform& chosen() {
  const char* name = std::getenv("TSHARD_SIM_PLATFORM");
  std::string names;
  for (const auto& p : platforms) {
    if (name && std::strcmp(name, p.name) == 0) return p;
    names += std::string(names.empty() ? "" : ", ") + p.name;
  }
  fail(std::string("TSHARD_SIM_PLATFORM=") + (name ? name : "") + " names no platform: " + names);
}

}  // namespace

extern "C" void load_platform(const sg4::Engine&);
void load_platform(const sg4::Engine&) {
  const Platform& p = chosen();
  const char* n = std::getenv("TSHARD_SIM_NODES");
  const int nodes = n ? std::atoi(n) : 1;
  if (nodes < 1 || nodes > p.max_nodes || (nodes > 16 && nodes % 16 != 0))
    fail(std::string(p.name) + " has 1 to " + std::to_string(p.max_nodes) +
         " nodes (16 or fewer, or a multiple of 16), not " + (n ? n : ""));
  double flops = p.core_flops;
  if (flops == 0) {
    const char* h = std::getenv("TSHARD_SIM_HOST_FLOPS");
    flops = h ? std::atof(h) : 0;
    if (flops <= 0) fail(std::string(p.name) + "'s cores run at this machine's speed: set TSHARD_SIM_HOST_FLOPS");
  }
  const auto params = nodes <= 16 ? sg4::FatTreeParams(1, {unsigned(nodes)}, {1}, {1})
                                  : sg4::FatTreeParams(2, {16, unsigned(nodes / 16)}, {1, 16}, {1, 1});
  auto host = [&](sg4::NetZone* zone, const std::vector<unsigned long>&, unsigned long id) {
    const sg4::Host* h = zone->create_host("node-" + std::to_string(id), flops)->set_core_count(p.cores)->seal();
    return std::make_pair(h->get_netpoint(), static_cast<simgrid::kernel::routing::NetPoint*>(nullptr));
  };
  auto memory = [&](sg4::NetZone* zone, const std::vector<unsigned long>&, unsigned long id) {
    return zone->create_link("node-" + std::to_string(id) + "-memory", p.memory_bw)
        ->set_latency(p.memory_lat)
        ->set_sharing_policy(sg4::Link::SharingPolicy::SHARED)
        ->seal();
  };
  sg4::NetZone* zone = sg4::create_fatTree_zone(p.name, nullptr, params, {host, memory, {}}, p.network_bw,
                                                p.network_lat, sg4::Link::SharingPolicy::SPLITDUPLEX);
  zone->seal();
}
