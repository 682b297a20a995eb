//! rl-proxy end to end, one test binary: each file below was a binary of its own, and
//! each cost 8-17 s of a cold CI build to compile and link (the HTTP client, the runtime
//! and `common` again in every one). The tests still run one at a time where they start
//! processes (`common::SERIAL`), as they did when the binaries ran one after another.
//! Run one file's tests by its module: `cargo test -p rl-proxy --test e2e rls::`.

mod common;

mod cli;
mod diagnosis;
mod fields;
mod forward_auth_real;
mod forwarding;
mod nginx_real_ip;
// `--mode rls` (the default feature `rls`)
#[cfg(feature = "rls")]
mod rls;
#[cfg(feature = "rls")]
mod rls_envoy;
