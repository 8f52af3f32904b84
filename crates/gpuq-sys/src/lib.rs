//! The only crate of gpuq that contains `unsafe` code.
//!
//! Everything here is a thin, typed wrapper over one syscall or one
//! `pre_exec` hook. Each `unsafe` block carries a `// SAFETY:` comment that
//! states the invariant it relies on; the workspace denies
//! `clippy::undocumented_unsafe_blocks`. Callers in the other crates stay
//! `#![forbid(unsafe_code)]`-clean.
#![allow(unsafe_code)]

pub mod acl;
pub mod blk;
pub mod fsid;
pub mod net;
pub mod proc;
pub mod term;
