// dist_probe MODE TIMEOUT_MS: one rank of a process group formed from torchrun's variables
// (tests/dist/distributed_test.cpp starts the ranks). Prints what each collective gave.
//   collectives   sum, max, broadcast of a module, mean gradients in buckets, barrier
//   leave         joins the group, then exits at once (a rank that dies)
// After joining each rank prints whether SIGPIPE is ignored (joining a group ignores it); at the
// end, its peak resident memory (VmHWM).
// Exit code 0; 3 with the error on stderr when a collective fails; 2 for bad variables.
#include <signal.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "trainer/distributed.h"
#include "trainer/error.h"

int main(int argc, char** argv) {
  if (argc < 3) return 2;
  const std::string mode = argv[1];
  const std::chrono::milliseconds timeout(std::atoll(argv[2]));
  try {
    const trainer::DistEnv env = trainer::DistEnv::from_env();
    trainer::ProcessGroup pg(env, timeout);
    std::printf("joined rank %lld of %lld\n", static_cast<long long>(pg.rank()), static_cast<long long>(pg.size()));
    struct sigaction pipe {};
    ::sigaction(SIGPIPE, nullptr, &pipe);
    std::printf("SIGPIPE %s\n", pipe.sa_handler == SIG_IGN ? "ignored" : "not ignored");
    std::fflush(stdout);
    if (mode == "leave") return 0;
    std::vector<at::Tensor> t{at::full({3}, double(pg.rank() + 1), at::kFloat)};
    pg.all_reduce_sum(t);
    std::printf("sum %g\n", t[0][2].item<double>());
    std::printf("max %lld\n", static_cast<long long>(pg.all_reduce_max(10 * pg.rank())));
    // Different weights on each rank until rank 0's are broadcast.
    torch::manual_seed(100 + static_cast<std::uint64_t>(pg.rank()));
    torch::nn::Linear layer(4, 3);
    trainer::broadcast_module_state(pg, *layer);
    std::printf("weights %.6f\n", layer->weight.sum().item<double>() + layer->bias.sum().item<double>());
    // Gradients rank + 1 everywhere: their mean over 2 ranks is 1.5; the bias has none on rank
    // 1 (zeros there): its mean is 0.5. Buckets of 16 bytes: one tensor each and more.
    layer->weight.mutable_grad() = at::full({3, 4}, double(pg.rank() + 1));
    if (pg.rank() == 0) layer->bias.mutable_grad() = at::full({3}, 1.0);
    trainer::all_reduce_gradients(pg, layer->parameters(), 1.0 / double(pg.size()), 16);
    std::printf("grad %g %g\n", layer->weight.grad()[1][2].item<double>(), layer->bias.grad()[0].item<double>());
    pg.barrier();
    // The most memory this process held (a peer that announced a huge request must not have
    // made the store allocate it).
    std::ifstream status("/proc/self/status");
    for (std::string line; std::getline(status, line);) {
      if (line.rfind("VmHWM:", 0) == 0) std::printf("peak %lld kB\n", std::atoll(line.c_str() + 6));
    }
    std::printf("done\n");
    return 0;
  } catch (const trainer::UsageError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 3;
  }
}
