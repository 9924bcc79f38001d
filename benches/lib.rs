//! Benchmarks only; see `throughput.rs` and `engine_overhead.rs`, run with `cargo bench`, and
//! docs/benchmarks.md for how the numbers are compared with llama.cpp and mlx-lm.
