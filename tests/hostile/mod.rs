//! Hostile calls: sizes no machine holds, ids and arguments no table
//! accepts, files that lie about themselves. Every call must return the
//! precise `Err` (or `Ok` with the right values), never panic or abort, and
//! leave every output it was given exactly as it was.
//!
//! These run in debug builds (`cargo test`), so arithmetic overflow inside
//! the crate would panic here rather than wrap.

mod arguments;
mod files;
mod sizes;
