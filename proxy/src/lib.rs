//! `rl-proxy`: a small HTTP/1.1 reverse proxy, a forward-auth decision service and
//! Envoy's rate limit service, each admitting requests through Ratelimitly (the
//! `ratelimitly-tower` layer over the client engine). This library is the whole of it:
//! the binary (`src/main.rs`) only parses the command line and calls [`entry::run`];
//! the load tools and the fuzz targets use the same modules.
//!
//! ```text
//! RATELIMITLY_API_KEY=... rl-proxy [--mode proxy|forward-auth|rls]
//!     (--upstream http://HOST:PORT | --config FILE [--check]) [--deny-status 429]
//!     [--key-file PATH] [--log-format text|json]
//!     (--endpoint ID@IP:PORT ... | --domain D [--dns-server IP:PORT])
//!     [--listen 127.0.0.1:0] [--admin-listen 127.0.0.1:0]
//!     [--limit COUNT/WINDOW|off] [--key-by ip|path|header:NAME] [--on-failure open|closed]
//!     [--admission engine|official] [--engine-core hosted|pinned]
//!     [--header-timeout 10s] [--idle-timeout 60s] [--upstream-timeout 30s]
//!     [--max-connections 10000] [--trust-forwarded CIDR ...]
//!     [--client-ip-from xff|forwarded|real-ip|peer] [--log-format text|json]
//! ```
//!
//! DURATION arguments use the window syntax of `--limit`: a whole number and a unit
//! `ms`, `s`, `m` or `h` (`500ms`, `10s`, `1m`).
//!
//! `rl-proxy --help` ends with examples, the exit codes (0: stopped by SIGINT or SIGTERM,
//! or `--check` passed; 2: bad arguments, files or key; 1: starting failed otherwise)
//! and the environment variables read (`RATELIMITLY_API_KEY`, `RUST_LOG`):
//! [`cli::AFTER_HELP`]. `proxy/README.md` has a quickstart against a local test server
//! and the route file's reference.
//!
//! Timeouts and limits:
//! - `--header-timeout` (default 10s): a connection that has not sent a whole request head
//!   within it is closed: counted from accept for the first request (a silent
//!   connection too) and from the first byte of each later one.
//! - `--idle-timeout` (default 60s): a keep-alive connection with no traffic between requests
//!   for it is closed.
//! - `--upstream-timeout` (default 30s): no response head from the upstream within it: the
//!   client gets `504 Gateway Timeout` (the upstream request is dropped).
//! - `--max-connections` (default 10000): client connections open at once. Beyond it a new
//!   connection is accepted and closed at once (no response: the client sees the
//!   connection closed), counted in `rl_proxy_connections_refused_total` and logged
//!   as a warning at most once a second.
//!
//! A decision service: `--mode forward-auth` (no `--upstream`) answers any path for
//! nginx `auth_request`, Traefik ForwardAuth, Caddy `forward_auth`, HAProxy (a Lua
//! action) or Envoy `ext_authz` (HTTP): `200` (empty body) when granted, `--deny-status` (default 429) with `Retry-After`
//! when rejected, and the failure policy otherwise (`open`: 200, `closed`: 503). The
//! request decided (route matching, `--key-by path`) is the original one, from
//! `X-Original-URI` / `X-Forwarded-Uri` and `X-Original-Method` /
//! `X-Forwarded-Method` (the shipped front proxy configurations overwrite or strip
//! those a client sends); the client address is the TCP peer unless it is trusted
//! (below).
//!
//! Who the client is, in every mode (`client::client_ip`, the rule of
//! `ratelimitly_tower::forwarded`): the TCP peer, unless the peer is in
//! `--trust-forwarded CIDR` (repeatable; the config file's `trust_forwarded` list adds
//! to it). From a trusted peer, only the header `--client-ip-from` names (the file's
//! `client_ip_from` when the flag is absent): `xff` (default) the rightmost
//! `X-Forwarded-For` address that is not itself trusted, `forwarded` the same in RFC
//! 7239 `Forwarded`, `real-ip` `X-Real-IP` as nginx's realip module believes it (the
//! trusted peer's one `X-Real-IP` address is the client; `X-Forwarded-For` not read: for
//! nginx's classic `proxy_set_header X-Real-IP $remote_addr;`, and only for a proxy that
//! overwrites that header), `peer` no header. A trusted peer that names nobody
//! (`real-ip` with an `X-Real-IP` absent, repeated or no address; `xff` with an
//! `X-Real-IP` and no `X-Forwarded-For` at all: a front proxy that sets only
//! `X-Real-IP`, every client in its one bucket) is counted in
//! `rl_proxy_client_ip_unvouched_total` and warned
//! about. A header the client can also send is never believed on
//! its own: the proxy in front must write the one named (`proxy/README.md` has a tested
//! configuration for nginx, Caddy, Traefik, HAProxy and Envoy). In proxy mode the
//! upstream receives `X-Forwarded-For` with the TCP peer appended (an existing value
//! kept: `EXISTING, PEER`).
//!
//! Routes from a file: `--config FILE` (TOML; the format is in the `config` module's
//! docs) replaces `--upstream`, `--limit`, `--key-by` and `--on-failure`, which conflict
//! with it (the flags stay for the one-route case). `--config FILE --check` checks the
//! file and what the mode needs (proxy mode: an `upstream`) and exits 0, or 2 with a
//! message naming the line or the problem (a YAML file, envoyproxy/ratelimit's format,
//! is said to be for `--mode rls`, and the reverse). `SIGHUP` reloads the file:
//! new requests take the new routes; a file that does not check, changes `upstream`, or
//! limits a route while the file at start limited none (no admission backend was
//! started) is refused and the running routes kept (logged at warn; a reload at info). With
//! `--config`, admission is by the engine only (`--admission engine`).
//!
//! The admin listener: `GET /metrics`, `GET /healthz` (liveness) and `GET /readyz`
//! (readiness: 503 with the reason while no decision can be made; [`health`]).
//!
//! The admin page adds the proxy's own counters to the layer's:
//! `rl_proxy_connections_open`, `rl_proxy_connections_refused_total`,
//! `rl_proxy_connections_timed_out_total{timeout="header"|"idle"}` and
//! `rl_proxy_upstream_timeouts_total`.
//!
//! The engine's core runs hosted by default: as a task on the proxy's own Tokio runtime,
//! so admitting a request costs no thread hand-off (`EngineBuilder::runtime`; the
//! benchmark in `proxy/bench/` measures both).
//!
//! Envoy's rate limit service: `--mode rls` (feature `rls`, on by default) serves
//! `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit` over h2c on `--listen`,
//! with rules from envoyproxy/ratelimit YAML files (`--config FILE`, repeatable, one
//! domain each; `--check` checks them, SIGHUP reloads them, a bad reload keeps the
//! running rules and logs why as a warning). `--on-failure open|closed` answers a call
//! without a decision OK or `OVER_LIMIT`; without it the call is gRPC `UNAVAILABLE`. The
//! module [`rls`] documents the semantics.
//!
//!
//! # Modules
//!
//! | module | mode | owns |
//! |---|---|---|
//! | [`proxy`] | `--mode proxy` | its start: the upstream, the layer over it |
//! | [`forward_auth`] | `--mode forward-auth` | its start, the original request, the deny status |
//! | [`rls`] | `--mode rls` | Envoy's rate limit service: rules, decisions, gRPC |
//! | [`http_modes`] | proxy, forward-auth | the accept loop, connections, routes, forwarding, the admission backend |
//! | [`cli`] | all | the flags |
//! | [`start`] | all | runtime, key, engine, listeners, readiness line |
//! | [`admin`] | all | the admin listener: `/metrics`, `/healthz`, `/readyz` |
//! | [`health`] | all | the diagnosis: probes, causes, readiness |
//! | [`logging`] | all | `RUST_LOG`, `--log-format` |
//! | [`config`] | proxy, forward-auth | the route file |
//! | [`client`] | proxy, forward-auth | the client address |
//!
//! Owns: nothing of its own; the modules do. Must not touch: admission rules (the layer).

#![warn(missing_docs)]

pub mod admin;
pub mod cli;
pub mod client;
pub mod config;
pub mod entry;
pub mod forward_auth;
pub mod health;
pub mod http_modes;
pub mod logging;
pub mod proxy;
#[cfg(feature = "rls")]
pub mod rls;
pub mod start;

pub use cli::{Cli, Mode};
pub use start::StartError;
