//! Admission through the official `ratelimitly` crate (0.1.0, Tokio), used as a black
//! box so the benchmark can compare it with the engine behind the same layer.
//!
//! Owns: the conversion of a [`Consumption`] into an official request and of its result
//! into a [`Verdict`]. Must not touch: HTTP, the engine.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use ratelimitly::{Client, Decision, Error};
use ratelimitly_engine::{LatencyTracker, ResourceResult};
use ratelimitly_tower::{Admission, Consumption, FailureKind, Verdict};

/// The official client as an admission backend.
#[derive(Clone)]
pub struct OfficialAdmission {
    client: Client,
}

impl OfficialAdmission {
    /// Decisions from `client`.
    pub fn new(client: Client) -> Self {
        OfficialAdmission { client }
    }
}

fn failure_kind(e: &Error) -> Verdict {
    match e {
        Error::Timeout => Verdict::Failed(FailureKind::Timeout),
        Error::Discovery => Verdict::Failed(FailureKind::Discovery),
        Error::Communication(_) | Error::Protocol | Error::Authentication => {
            Verdict::Failed(FailureKind::Communication)
        }
        _ => Verdict::Invalid,
    }
}

fn tracker(t: &LatencyTracker) -> Result<ratelimitly::LatencyTracker, Error> {
    ratelimitly::LatencyTracker::builder(t.name())
        .sample_ttl(Duration::from_millis(u64::from(t.ttl_ms())))
        .max_samples(t.max_samples())
        .min_samples(t.min_samples())
        .build()
}

impl Admission for OfficialAdmission {
    type Future = Pin<Box<dyn Future<Output = Verdict> + Send>>;

    fn admit(&self, c: &Consumption) -> Self::Future {
        let client = self.client.clone();
        let c = c.clone();
        Box::pin(async move {
            let decide = async {
                let mut b = client.request();
                if !c.metrics_label().is_empty() {
                    b = b.metrics_label(c.metrics_label())?;
                }
                let mut windows = Vec::with_capacity(c.resources().len());
                for (r, n) in c.resources() {
                    let res = ratelimitly::Resource::new(
                        r.name(),
                        Duration::from_millis(u64::from(r.window_ms())),
                        r.rate_limit(),
                    )?;
                    windows.push(r.window_ms());
                    b = b.consume(&res, *n)?;
                }
                for (t, th) in c.guards() {
                    b = b.guard(&tracker(t)?, *th)?;
                }
                let resp = b.send().await?;
                Ok::<_, Error>((resp, windows))
            };
            match decide.await {
                Ok((resp, _)) if resp.decision() == Decision::Granted => Verdict::Granted,
                Ok((resp, windows)) => {
                    // The same rule as the engine's ResourceResult::retry_after, with the
                    // window taken from the request (results come in request order).
                    let retry_after = resp
                        .resource_results()
                        .iter()
                        .zip(windows)
                        .filter(|(r, _)| r.tokens_deficit() > 0)
                        .map(|(r, window_ms)| {
                            ResourceResult {
                                bucket_id: [0; 16],
                                window_ms,
                                actual_rate: r.actual_rate(),
                                deficit: r.tokens_deficit(),
                            }
                            .retry_after()
                        })
                        .max();
                    Verdict::Rejected { retry_after }
                }
                Err(e) => failure_kind(&e),
            }
        })
    }

    fn report(&self, t: &LatencyTracker, observed: Duration) {
        let Ok(official) = tracker(t) else { return };
        let client = self.client.clone();
        tokio::spawn(async move {
            let _ = client.report_latency(&official, observed).await;
        });
    }
}
