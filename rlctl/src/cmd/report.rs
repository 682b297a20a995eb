//! `rlctl report`: sends latency reports once to every endpoint through a one-core
//! engine and prints how many datagrams went out.
//!
//! Exit-status mapping: sent 0; configuration 2 (also an engine that cannot start on this
//! host: nothing was sent); discovery or communication failure 4.

use serde_json::json;

use ratelimitly_engine::key_source;
use ratelimitly_engine::proto::outcome::FailureCategory;

use super::request::start_failure;
use crate::cli::ReportCmd;
use crate::output::{EXIT_COMM, EXIT_CONFIG, EXIT_OK, print_json};
use crate::send::{self, ReportError};
use crate::servers::endpoints_for;

/// What the run did: datagrams, endpoints, the error, the exit status.
struct ReportSummary {
    datagrams: u32,
    endpoints: u32,
    error: Option<String>,
    code: u8,
}

fn fail(error: String, code: u8) -> ReportSummary {
    ReportSummary {
        datagrams: 0,
        endpoints: 0,
        error: Some(error),
        code,
    }
}

fn execute(r: &ReportCmd) -> ReportSummary {
    if r.tracker.len() != r.observed.len() {
        return fail(
            format!(
                "{} --tracker but {} --observed: give them in pairs",
                r.tracker.len(),
                r.observed.len()
            ),
            EXIT_CONFIG,
        );
    }
    let key = match key_source::load_key(r.key.key_file.as_deref()) {
        Ok(k) => k,
        Err(e) => return fail(e.to_string(), EXIT_CONFIG),
    };
    let mut entries = Vec::with_capacity(r.tracker.len());
    for (t, obs) in r.tracker.iter().zip(&r.observed) {
        match t.tracker() {
            Ok(tr) => entries.push((tr, *obs)),
            Err(e) => return fail(e.to_string(), EXIT_CONFIG),
        }
    }
    let endpoints = match endpoints_for(&r.servers, &key) {
        Ok(e) => e,
        Err(e) => return fail(e.to_string(), EXIT_COMM),
    };
    match send::report(&key, &endpoints, &entries) {
        Ok(run) => ReportSummary {
            datagrams: run.datagrams,
            endpoints: run.endpoints,
            error: None,
            code: EXIT_OK,
        },
        Err(ReportError::Start(e)) => fail(start_failure(&e), EXIT_CONFIG),
        Err(ReportError::Failed(f)) => {
            let code = if f.category() == FailureCategory::Configuration {
                EXIT_CONFIG
            } else {
                EXIT_COMM
            };
            fail(f.to_string(), code)
        }
    }
}

/// Runs `rlctl report`.
pub fn run(r: &ReportCmd) -> u8 {
    let s = execute(r);
    if r.json {
        print_json(
            &json!({ "datagrams": s.datagrams, "endpoints": s.endpoints, "error": s.error }),
        );
    } else if let Some(e) = &s.error {
        eprintln!("rlctl: {e}");
    } else {
        println!(
            "sent {} report datagrams to {} endpoints",
            s.datagrams, s.endpoints
        );
    }
    s.code
}
