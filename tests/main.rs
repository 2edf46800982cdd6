//! The integration tests, one module a file, in one test binary: each test
//! binary links its own copy of every kernel instance it calls, so one binary
//! builds and links them once (docs/testing.md has the figures).
//! `cargo test --test integration bag::` runs one file's tests.

mod common;

mod bag;
mod candle;
mod candle_quantized;
mod embedding;
mod embedding_bag;
mod executor;
mod files;
mod formats;
mod formats_golden;
mod hostile;
mod input;
mod kernels;
mod positions;
mod quantized;
mod table_kernels;
