#pragma once
// `trainer launch --nproc N -- <trainer args>`: a data-parallel run of N local processes, for
// users without torchrun.
#include <string>
#include <vector>

namespace trainer::cli {

/// Parses what follows `launch` (`--nproc N`, `--nproc=N`, then `--` and the trainer's
/// arguments), starts N processes of `self` with torchrun's variables (RANK, WORLD_SIZE,
/// LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT: $MASTER_PORT or a free
/// port) and TRAINER_GROUP_ID (random: the group's keys in its store, and the id a connection to the store must greet
/// with), forwards each SIGINT and SIGTERM to every rank,
/// and returns the first failure's exit code (the others get SIGTERM then, and SIGKILL 10 s later), 0 when all
/// finished. UsageError for bad arguments.
int launch(const std::string& self, const std::vector<std::string>& args);

}  // namespace trainer::cli
