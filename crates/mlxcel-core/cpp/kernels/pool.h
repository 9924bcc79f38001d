// A small fork-join pool for the CPU kernels.
//
// MLX's CPU backend runs each stream's tasks on one scheduler thread; a kernel dispatched there
// calls `parallel_for`, which runs on that thread plus `threads - 1` pool workers, so a kernel
// never uses more threads than asked (default: the cores this process may run on). Between
// kernels workers spin for a while before sleeping: a decode step runs ~200 matmuls a few tens of
// microseconds apart, and a condition-variable wake-up costs about as much as a small GEMV.
#pragma once

#include <cstdint>
#include <functional>

namespace mlxcel::kernels {

// Runs body(task) for every task in [0, tasks) on up to `threads` threads (the caller included),
// handing tasks out in order from a shared counter; returns when all are done.
void parallel_for(int threads, int tasks, const std::function<void(int task)>& body);

// The cores this process may run on (sched_getaffinity), at least 1.
int available_cores();

}  // namespace mlxcel::kernels
