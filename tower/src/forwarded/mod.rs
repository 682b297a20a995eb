//! Who the client is: the one rule, for [`crate::KeyBy::ClientIp`] and for `rl-proxy`
//! in every mode. A header that a client can also send is never believed on its own.
//!
//! # The rule ([`ClientIpRule`])
//!
//! - The peer (the address the TCP connection came from) is the client unless it is in
//!   the trusted list ([`TrustedProxies`]); from any other peer no header is read.
//! - From a trusted peer, the client comes from one source ([`ClientIpFrom`]), named
//!   for the kind of front proxy, which must write that header itself:
//!   - `xff` (the default): `X-Forwarded-For` read from right to left (each proxy
//!     appends the address it received the request from): the first address that is
//!     not trusted. The rightmost entry is the one the peer appended, so it is the
//!     peer's word, not the client's. For proxies that append or replace it: nginx
//!     with `$proxy_add_x_forwarded_for`, Caddy, Traefik, HAProxy (`option forwardfor`
//!     or the shipped Lua action), Envoy with `use_remote_address`.
//!   - `forwarded`: the same walk over RFC 7239 `Forwarded` `for=` nodes, for proxies
//!     that append `Forwarded`. Caddy 2.6, Traefik 3 and Envoy pass a client's
//!     `Forwarded` through unchanged: with them it is unsafe.
//!   - `real-ip`: `X-Real-IP`, as nginx's realip module believes the header it is
//!     told to (`real_ip_header X-Real-IP`) from a trusted peer: its one address is
//!     the client. For a front proxy that overwrites `X-Real-IP` with the address it
//!     received the request from (nginx's `proxy_set_header X-Real-IP
//!     $remote_addr;`, with or without `X-Forwarded-For`). Choose it only when your
//!     proxy overwrites that header: one that passes a client's `X-Real-IP` through
//!     lets the client choose its bucket.
//!   - `peer`: no header, the peer.
//! - The walk stops at the chain's end (every hop trusted) or at an entry that is no
//!   IP address (`unknown`, an obfuscated `_name`, garbage): the client is then the
//!   last trusted address reached, so a forged or broken entry never moves the key onto
//!   an address the client chose. Several lines of a header are joined in order.
//!
//! # When the trusted peer names nobody
//!
//! With `xff` and `forwarded`, `X-Real-IP` is not read: the chain decides (with `xff`,
//! an `X-Real-IP` and no `X-Forwarded-For` at all is reported: the peer is the key, as
//! it would be, but a proxy that sets only `X-Real-IP`, such as nginx's classic
//! `proxy_set_header X-Real-IP $remote_addr;`, puts every client in one bucket: use
//! `real-ip` with it). With `real-ip`, `X-Forwarded-For` is not read, and an
//! `X-Real-IP` that is absent, given twice (a client's and a proxy's) or no address
//! keys the request by the peer ([`ClientIp::Unvouched`]): every such request in the
//! one bucket of the proxy in front, and a warning is logged ([`UnvouchedLog`]).
//!
//! Owns: [`TrustedProxies`], [`ClientIpFrom`], [`ClientIpRule`] and the parsers of the
//! three headers (`parse`). Must not touch: requests beyond their headers, the engine.
//! Reused by `rl-proxy`; every parser here reads untrusted input and never panics.

mod parse;
mod rule;
mod trusted;

pub use parse::{parse_forwarded, parse_x_forwarded_for};
pub use rule::{ClientIp, ClientIpFrom, ClientIpFromError, ClientIpRule, UnvouchedLog};
pub use trusted::{TrustedProxies, TrustedProxiesError};
