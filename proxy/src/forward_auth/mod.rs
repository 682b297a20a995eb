//! `--mode forward-auth`: a decision service for the front proxies people run (nginx
//! `auth_request`, Caddy `forward_auth`, Traefik ForwardAuth, HAProxy's Lua action,
//! Envoy HTTP `ext_authz`). Any path is answered: `200` (empty body) when granted,
//! `--deny-status` (default 429) with `Retry-After` when rejected, and the failure
//! policy otherwise (`open`: 200; `closed`: 503 with `Retry-After`). The request decided
//! is the original one ([`original_request`]).
//!
//! Owns: the mode's start and the original request. Must not touch: the accept loop and
//! the layers (`crate::http_modes`).

use crate::cli::Cli;
use crate::http_modes::{self, Target};
use crate::start::StartError;

/// Runs `--mode forward-auth` until SIGINT or SIGTERM (or, with `--check`, checks the
/// route file).
pub fn run(cli: Cli) -> Result<(), StartError> {
    if cli.upstream.is_some() {
        return Err(StartError::Usage(
            "--mode forward-auth forwards nothing: no --upstream".into(),
        ));
    }
    http_modes::run(cli, Target::Grant)
}

/// `--mode forward-auth`: the request being decided is the original one named by
/// `X-Original-URI` / `X-Forwarded-Uri` and `X-Original-Method` / `X-Forwarded-Method`
/// (nginx `auth_request`, Traefik ForwardAuth, Caddy `forward_auth`); without them, the
/// request itself.
pub fn original_request<B>(req: &mut http::Request<B>) {
    let h = req.headers();
    let uri = h
        .get("x-original-uri")
        .or_else(|| h.get("x-forwarded-uri"))
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.parse::<http::Uri>().ok());
    let method = h
        .get("x-original-method")
        .or_else(|| h.get("x-forwarded-method"))
        .and_then(|v| http::Method::from_bytes(v.as_bytes()).ok());
    if let Some(u) = uri {
        *req.uri_mut() = u;
    }
    if let Some(m) = method {
        *req.method_mut() = m;
    }
}
