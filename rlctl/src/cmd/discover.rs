//! `rlctl discover`: DNS discovery of the servers, with start times and the oldest. The
//! domain queried is named in the output, also when discovery fails.

use std::net::SocketAddr;

use serde_json::{Value, json};

use ratelimitly_engine::discovery::{DiscoveredServer, Discovery};
use ratelimitly_engine::key_source;

use crate::cli::DiscoverCmd;
use crate::output::{EXIT_COMM, EXIT_CONFIG, EXIT_OK, print_json, simple_error};
use crate::servers::{ServersError, discover};
use rl_toolkit::utc::utc_text;

/// Runs `rlctl discover`.
pub fn run(c: &DiscoverCmd) -> u8 {
    let key = if c.dns.domain.is_none() {
        match key_source::load_key(c.key.key_file.as_deref()) {
            Ok(k) => Some(k),
            Err(e) => return simple_error(c.json, &e.to_string(), EXIT_CONFIG),
        }
    } else {
        None
    };
    let (domain, d) = match discover(&c.dns, key.as_ref()) {
        Ok(x) => x,
        Err(e @ ServersError::NoDomain) => {
            return simple_error(c.json, &e.to_string(), EXIT_CONFIG);
        }
        Err(e @ ServersError::Discovery { .. }) => {
            return simple_error(c.json, &e.to_string(), EXIT_COMM);
        }
    };
    if c.json {
        print_json(&discovery_json(&domain, &d));
    } else {
        print_text(&domain, &d);
    }
    EXIT_OK
}

fn addresses(s: &DiscoveredServer) -> Vec<String> {
    s.addrs
        .iter()
        .map(|ip| SocketAddr::new(*ip, s.port).to_string())
        .collect()
}

fn discovery_json(domain: &str, d: &Discovery) -> Value {
    let oldest = d.oldest().map(|s| s.server_id);
    let servers: Vec<Value> = d
        .servers
        .iter()
        .map(|s| {
            json!({
                "server_id": s.server_id,
                "target": s.target,
                "port": s.port,
                "addresses": addresses(s),
                "ttl_s": s.ttl_s,
                "start_time_unix_s": s.start_time_unix_s,
                "start_time_utc": utc_text(s.start_time_unix_s),
                "oldest": Some(s.server_id) == oldest,
            })
        })
        .collect();
    json!({
        "domain": domain,
        "servers": servers,
        "oldest_server_id": oldest,
        "min_ttl_s": d.min_ttl_s,
        "error": null,
    })
}

fn print_text(domain: &str, d: &Discovery) {
    let oldest = d.oldest().map(|s| s.server_id);
    println!(
        "domain: {domain}  ({} servers, min TTL {} s)",
        d.servers.len(),
        d.min_ttl_s
    );
    for s in &d.servers {
        let mark = if Some(s.server_id) == oldest {
            " (oldest)"
        } else {
            ""
        };
        println!(
            "server {}{mark}  target {}  started {} (unix {})  ttl {} s  addresses {}",
            s.server_id,
            s.target,
            utc_text(s.start_time_unix_s),
            s.start_time_unix_s,
            s.ttl_s,
            addresses(s).join(", ")
        );
    }
}
