//! The startup check: does each endpoint answer validly?
//!
//! Owns: [`verify`] and its report. Built from the engine's public API only: one
//! one-core engine per endpoint sends one request for a probe bucket
//! (`ratelimitly-verify`, a high limit) and its statistics say why an answer was not
//! accepted. Must not touch: the engine's internals.

use std::fmt;
use std::time::Duration;

use ratelimitly_engine::proto::wire::DropReason;
use ratelimitly_engine::{ApiKey, Cores, Endpoint, Engine, Resource};

/// One endpoint's result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointCheck {
    /// The endpoint checked.
    pub endpoint: Endpoint,
    /// What is wrong; `None` when it answered validly.
    pub problem: Option<EndpointProblem>,
}

impl EndpointCheck {
    /// It answered validly.
    pub fn is_ok(&self) -> bool {
        self.problem.is_none()
    }
}

/// Why an endpoint's answer was not accepted.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EndpointProblem {
    /// Answers came from a server whose id is not the endpoint's id: the id in
    /// `ID@IP:PORT` must be the server's own id.
    WrongServerId,
    /// Answers came but were dropped for this reason (e.g. `auth_failed`: another key).
    Dropped(&'static str),
    /// Nothing came back within the horizon (wrong address or port, server down,
    /// datagrams filtered).
    NoAnswer,
    /// The check itself failed (the probe engine did not build or send).
    Check(String),
}

impl fmt::Display for EndpointProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EndpointProblem::WrongServerId => f.write_str(
                "answers from another server id (the endpoint's id must be the server's id)",
            ),
            EndpointProblem::Dropped(r) => write!(f, "answers dropped: {r}"),
            EndpointProblem::NoAnswer => {
                f.write_str("no answer (wrong address or port, server down, or filtered)")
            }
            EndpointProblem::Check(e) => write!(f, "check failed: {e}"),
        }
    }
}

/// Sends one request to each endpoint on its own and reports, per endpoint, whether a
/// valid answer came back. Each check takes at most the default horizon (tens of
/// milliseconds) plus the probe engine's start and stop. Logs each problem at `warn!`.
/// Needs no particular async runtime.
pub async fn verify(key: &ApiKey, endpoints: &[Endpoint]) -> Vec<EndpointCheck> {
    let mut out = Vec::with_capacity(endpoints.len());
    for ep in endpoints {
        let problem = check_one(key, *ep).await;
        if let Some(p) = &problem {
            tracing::warn!(endpoint = %ep, problem = %p, "ratelimitly endpoint check failed");
        }
        out.push(EndpointCheck {
            endpoint: *ep,
            problem,
        });
    }
    out
}

async fn check_one(key: &ApiKey, ep: Endpoint) -> Option<EndpointProblem> {
    let engine = match Engine::builder(key.clone())
        .cores(Cores::Count(1))
        .endpoints(vec![ep])
        .socket_buffers(1 << 16, 1 << 16)
        .in_flight_per_core(16)
        .build_async()
        .await
    {
        Ok(e) => e,
        Err(e) => return Some(EndpointProblem::Check(e.to_string())),
    };
    let probe = match Resource::new("ratelimitly-verify", Duration::from_secs(1), 1_000_000) {
        Ok(r) => r,
        Err(e) => return Some(EndpointProblem::Check(e.to_string())),
    };
    let h = engine.handle();
    let outcome = h.request().consume(&probe, 1).send().await;
    let problem = match outcome {
        Ok(resp) if resp.selected_server_id() == Some(ep.server_id) => None,
        Ok(_) => Some(EndpointProblem::WrongServerId),
        Err(f) => {
            let stats = h.stats();
            if stats.drops_of(DropReason::UnknownServer) > 0 {
                Some(EndpointProblem::WrongServerId)
            } else if let Some(r) = DropReason::ALL
                .iter()
                .find(|r| stats.drops_of(**r) > 0 && **r != DropReason::NotExpected)
            {
                Some(EndpointProblem::Dropped(r.name()))
            } else if matches!(f, ratelimitly_engine::Failure::Timeout { .. }) {
                Some(EndpointProblem::NoAnswer)
            } else {
                Some(EndpointProblem::Check(f.to_string()))
            }
        }
    };
    engine.shutdown_graceful().await;
    problem
}
