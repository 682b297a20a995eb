//! The diagnosis, sans IO: what the service knows of its ability to decide, from the
//! admission counters (decisions and failures, read on each tick) and the probes'
//! findings, with time as a parameter. It says when to probe, what to log (once per
//! change), whether the service is ready, and why not.
//!
//! Owns: the readiness rule and the cause of each endpoint. Must not touch: sockets,
//! clocks, tasks, the log itself (lines are handed out as data).

use std::time::{Duration, Instant};

use ratelimitly_engine::Endpoint;
use rl_toolkit::errqueue::IcmpKind;
use rl_toolkit::words::{EndpointFinding, Finding};

/// While failing (or not ready), a new probe at most this often.
pub const PROBE_INTERVAL: Duration = Duration::from_secs(5);

/// A decision within this long makes the service ready whatever the last probe said.
pub const RECENT: Duration = Duration::from_secs(10);

/// Why an endpoint does not decide, as the probe found it (or that it answers).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cause {
    /// The probe got a valid answer.
    Answers,
    /// What the probe saw instead (an ICMP error, another server id, datagrams the key
    /// cannot open, silence).
    Finding(Finding),
    /// The probe could not be sent (no socket, or the request could not be encoded).
    ProbeFailed(String),
}

/// The metric label of each cause, in the order they are exported.
pub const CAUSES: [&str; 9] = [
    "answers",
    "port_unreachable",
    "host_unreachable",
    "net_unreachable",
    "icmp_error",
    "other_server_id",
    "unreadable",
    "silent",
    "probe_failed",
];

impl Cause {
    /// Its metric label (one of [`CAUSES`]).
    pub fn label(&self) -> &'static str {
        match self {
            Cause::Answers | Cause::Finding(Finding::Answered) => "answers",
            Cause::Finding(Finding::Icmp(e)) => match e.kind {
                IcmpKind::PortUnreachable => "port_unreachable",
                IcmpKind::HostUnreachable => "host_unreachable",
                IcmpKind::NetUnreachable => "net_unreachable",
                IcmpKind::Other(_) => "icmp_error",
            },
            Cause::Finding(Finding::OtherServer { .. }) => "other_server_id",
            Cause::Finding(Finding::Unreadable { .. }) => "unreadable",
            Cause::Finding(Finding::NoAnswer) => "silent",
            Cause::ProbeFailed(_) => "probe_failed",
        }
    }

    fn answers(&self) -> bool {
        matches!(self, Cause::Answers | Cause::Finding(Finding::Answered))
    }

    /// The same cause for logging purposes (counts of unreadable datagrams aside).
    fn same(&self, other: &Cause) -> bool {
        match (self, other) {
            (
                Cause::Finding(Finding::Unreadable { reason: a, .. }),
                Cause::Finding(Finding::Unreadable { reason: b, .. }),
            ) => a == b,
            (a, b) => a.answers() && b.answers() || a == b,
        }
    }

    /// The cause, said of `endpoint` (the toolkit's wording: rlctl says the same).
    pub fn describe(&self, endpoint: Endpoint) -> String {
        match self {
            Cause::Answers => format!("{endpoint}: server {} answers", endpoint.server_id),
            Cause::Finding(f) => EndpointFinding {
                endpoint,
                finding: f.clone(),
            }
            .to_string(),
            Cause::ProbeFailed(e) => format!("{endpoint}: the probe could not be sent: {e}"),
        }
    }
}

/// A line to log, at the level it names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Note {
    /// A problem, or the end of one: `warn`.
    Warn(String),
    /// What the probe at start found where all is well: `info`.
    Info(String),
}

/// Ready, or not and why (one line).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Readiness {
    /// Decisions are being made (or a probe was answered).
    Ready,
    /// No decision can be made now.
    NotReady(String),
}

/// The diagnosis of one admission backend.
#[derive(Debug)]
pub struct Diagnosis {
    /// Each endpoint probed, and its last cause (`None`: not probed yet).
    causes: Vec<(Endpoint, Option<Cause>)>,
    decided: u64,
    failed: u64,
    last_decision: Option<Instant>,
    /// Failures since the last decision.
    failing: bool,
    last_probe: Option<Instant>,
    probing: bool,
    /// The last probe found no endpoint answering (and none was known: empty list).
    probe_says_down: Option<String>,
    readiness: Readiness,
    probes: u64,
}

impl Default for Diagnosis {
    fn default() -> Self {
        Diagnosis {
            causes: Vec::new(),
            decided: 0,
            failed: 0,
            last_decision: None,
            failing: false,
            last_probe: None,
            probing: false,
            probe_says_down: None,
            readiness: Readiness::Ready,
            probes: 0,
        }
    }
}

impl Diagnosis {
    /// The counters at `now`: decisions (granted and rejected) and failures (timeouts,
    /// communication and discovery failures, the breaker's short circuits) so far. Says
    /// whether to probe now, and what to log.
    pub fn tick(&mut self, now: Instant, decided: u64, failed: u64) -> (bool, Vec<Note>) {
        let mut notes = Vec::new();
        if decided > self.decided {
            self.last_decision = Some(now);
            self.failing = false;
            self.probe_says_down = None;
        } else if failed > self.failed {
            self.failing = true;
        }
        self.decided = decided;
        self.failed = failed;
        let was = self.readiness.clone();
        self.readiness = self.evaluate(now);
        if let (Readiness::NotReady(_), Readiness::Ready) = (&was, &self.readiness) {
            notes.push(Note::Warn(
                "ratelimitly decisions are made again: ready".into(),
            ));
        }
        let due = self
            .last_probe
            .is_none_or(|t| now.saturating_duration_since(t) >= PROBE_INTERVAL);
        let wanted = self.failing || matches!(self.readiness, Readiness::NotReady(_));
        let recovered = matches!(was, Readiness::NotReady(_)) && self.readiness == Readiness::Ready;
        let probe = !self.probing && (recovered || (wanted && due));
        if probe {
            self.probing = true;
        }
        (probe, notes)
    }

    /// A probe is about to run (the first one, at start, does not come from a tick).
    pub fn probe_started(&mut self) {
        self.probing = true;
    }

    /// The probe that ran at `now` found `found` (per endpoint), or could not be sent
    /// (`Err`). Says what to log: each endpoint's cause once per change.
    pub fn probed(
        &mut self,
        now: Instant,
        found: Result<Vec<(Endpoint, Cause)>, String>,
    ) -> Vec<Note> {
        self.probing = false;
        self.last_probe = Some(now);
        let first = self.probes == 0;
        self.probes += 1;
        let mut notes = Vec::new();
        let found = match found {
            Ok(f) => f,
            Err(e) => self
                .causes
                .iter()
                .map(|(ep, _)| (*ep, Cause::ProbeFailed(e.clone())))
                .collect(),
        };
        if found.is_empty() {
            self.probe_says_down =
                Some("no Ratelimitly endpoint is known (discovery found none yet)".into());
            if first || self.causes.iter().any(|(_, c)| c.is_some()) {
                notes.push(Note::Warn(
                    "ratelimitly: no endpoint to probe (discovery found none yet)".into(),
                ));
            }
            self.causes.clear();
        }
        let mut down = Vec::new();
        for (ep, cause) in &found {
            let old = self.causes.iter().position(|(e, _)| e == ep);
            let before = old.and_then(|i| self.causes[i].1.clone());
            let changed = before.as_ref().is_none_or(|b| !b.same(cause));
            if changed {
                let text = cause.describe(*ep);
                notes.push(match (cause.answers(), &before) {
                    (true, None) => Note::Info(format!("ratelimitly endpoint {text}")),
                    (true, Some(_)) => Note::Warn(format!("ratelimitly endpoint {text} again")),
                    (false, _) => Note::Warn(format!("ratelimitly endpoint cannot decide: {text}")),
                });
            }
            match old {
                Some(i) => self.causes[i].1 = Some(cause.clone()),
                None => self.causes.push((*ep, Some(cause.clone()))),
            }
            if !cause.answers() {
                down.push(cause.describe(*ep));
            }
        }
        self.causes
            .retain(|(e, _)| found.iter().any(|(f, _)| f == e));
        if !found.is_empty() {
            self.probe_says_down = (down.len() == found.len())
                .then(|| format!("no Ratelimitly endpoint answers: {}", down.join("; ")));
            if self.probe_says_down.is_none() && self.failing {
                // an endpoint answers the probe: the failures were passing
                self.failing = false;
            }
        }
        let was = self.readiness.clone();
        self.readiness = self.evaluate(now);
        if let (Readiness::Ready, Readiness::NotReady(why)) = (&was, &self.readiness) {
            notes.push(Note::Warn(format!("not ready: {why}")));
        }
        notes
    }

    fn evaluate(&self, now: Instant) -> Readiness {
        let recent = self
            .last_decision
            .is_some_and(|t| now.saturating_duration_since(t) < RECENT);
        if recent && !self.failing {
            return Readiness::Ready;
        }
        if let Some(why) = &self.probe_says_down {
            return Readiness::NotReady(why.clone());
        }
        Readiness::Ready
    }

    /// Ready, or why not.
    pub fn readiness(&self) -> &Readiness {
        &self.readiness
    }

    /// Each endpoint probed and its last cause.
    pub fn causes(&self) -> impl Iterator<Item = (Endpoint, &Cause)> {
        self.causes
            .iter()
            .filter_map(|(e, c)| Some((*e, c.as_ref()?)))
    }

    /// Probes run so far.
    pub fn probes(&self) -> u64 {
        self.probes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(id: u64) -> Endpoint {
        format!("{id}@127.0.0.1:4000").parse().unwrap()
    }

    fn warns(notes: &[Note]) -> Vec<&str> {
        notes
            .iter()
            .filter_map(|n| match n {
                Note::Warn(s) => Some(s.as_str()),
                Note::Info(_) => None,
            })
            .collect()
    }

    #[test]
    fn a_wrong_server_id_is_not_ready_and_logged_once() {
        let t0 = Instant::now();
        let mut d = Diagnosis::default();
        d.probe_started();
        let other = || {
            Ok(vec![(
                ep(12345),
                Cause::Finding(Finding::OtherServer { actual: 77 }),
            )])
        };
        let notes = d.probed(t0, other());
        let w = warns(&notes);
        assert_eq!(w.len(), 2, "{notes:?}");
        assert!(w[0].contains("server id 77") && w[0].contains("claims server id 12345"));
        let Readiness::NotReady(why) = d.readiness().clone() else {
            panic!("ready")
        };
        assert!(why.contains("server id 77"), "{why}");
        // failures keep coming: a probe every PROBE_INTERVAL, logged no more
        let (probe, _) = d.tick(t0 + Duration::from_secs(1), 0, 10);
        assert!(!probe);
        let (probe, _) = d.tick(t0 + PROBE_INTERVAL, 0, 20);
        assert!(probe);
        assert!(d.probed(t0 + PROBE_INTERVAL, other()).is_empty());
        // the right id: answers, logged once, ready at once
        let (_, _) = d.tick(t0 + 2 * PROBE_INTERVAL, 0, 20);
        let notes = d.probed(
            t0 + 2 * PROBE_INTERVAL,
            Ok(vec![(ep(12345), Cause::Answers)]),
        );
        assert_eq!(warns(&notes).len(), 1, "{notes:?}");
        assert_eq!(d.readiness(), &Readiness::Ready);
    }

    #[test]
    fn decisions_make_it_ready_and_failures_ask_for_a_probe() {
        let t0 = Instant::now();
        let mut d = Diagnosis::default();
        d.probe_started();
        assert!(
            d.probed(t0, Ok(vec![(ep(1), Cause::Answers)]))
                .iter()
                .all(|n| matches!(n, Note::Info(_)))
        );
        let (probe, _) = d.tick(t0 + Duration::from_millis(500), 5, 0);
        assert!(!probe);
        assert_eq!(d.readiness(), &Readiness::Ready);
        // failures without a decision: a probe (the last one is 5 s old)
        let (probe, _) = d.tick(t0 + Duration::from_secs(6), 5, 3);
        assert!(probe);
        let silent = Ok(vec![(ep(1), Cause::Finding(Finding::NoAnswer))]);
        let notes = d.probed(t0 + Duration::from_secs(6), silent);
        assert_eq!(warns(&notes).len(), 2, "{notes:?}");
        assert!(matches!(d.readiness(), Readiness::NotReady(_)));
        // a decision again: ready, logged, and a probe to refresh the causes
        let (probe, notes) = d.tick(t0 + Duration::from_secs(7), 6, 3);
        assert!(probe);
        assert_eq!(
            warns(&notes),
            ["ratelimitly decisions are made again: ready"]
        );
        assert_eq!(d.readiness(), &Readiness::Ready);
    }

    #[test]
    fn a_probe_that_cannot_be_sent_is_a_cause() {
        let t0 = Instant::now();
        let mut d = Diagnosis::default();
        d.probe_started();
        d.probed(t0, Ok(vec![(ep(1), Cause::Finding(Finding::NoAnswer))]));
        let notes = d.probed(t0 + PROBE_INTERVAL, Err("no socket".into()));
        assert!(warns(&notes)[0].contains("the probe could not be sent: no socket"));
        assert_eq!(d.causes().next().unwrap().1.label(), "probe_failed");
        assert!(CAUSES.contains(&"probe_failed"));
    }
}
