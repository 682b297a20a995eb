//! Carries a [`Plan`] out against the run's embedded servers: stops and restarts
//! responders, switches bursts on and off on every responder, starts, publishes,
//! withdraws and stops added servers through the embedded DNS responder; logs each
//! event as it happens.
//!
//! Owns the responders' fault settings during `--chaos` and the event log. Must not
//! drive load (`run.rs`) or judge outcomes (`verdict.rs`).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rl_responder::{Faults, ResponderHandle};
use serde_json::{Map, Value, json};

use super::schedule::{Burst, FaultKind, Op, Plan};
use crate::cli::Args;
use crate::setup::{self, Servers};

/// One event as it happened (`chaos.events[]`).
#[derive(Clone, Debug)]
pub struct Event {
    /// Seconds since the schedule start (the measured window's start).
    pub at_s: f64,
    pub kind: FaultKind,
    /// Planned end (s), resident memory at the start (KiB), and what the kind adds
    /// (server, address, burst parameters).
    pub details: Map<String, Value>,
}

/// The run's servers under the schedule.
pub struct Controller<'a> {
    servers: &'a Servers,
    args: &'a Args,
    responder_cores: &'a [usize],
    /// Base servers (id, address), oldest first.
    base: Vec<(u64, SocketAddr)>,
    /// Added servers by slot: (id, address, still published).
    added: Vec<Option<(u64, SocketAddr, bool)>>,
    bursts: Vec<(usize, Burst)>,
    pub events: Vec<Event>,
    /// Steps that failed (a restart that could not bind, an added server that did not start).
    pub failures: Vec<String>,
}

impl<'a> Controller<'a> {
    pub fn new(servers: &'a Servers, args: &'a Args, responder_cores: &'a [usize]) -> Self {
        let base = servers
            .endpoints
            .iter()
            .map(|e| (e.server_id, e.addr))
            .collect();
        Controller {
            servers,
            args,
            responder_cores,
            base,
            added: Vec::new(),
            bursts: Vec::new(),
            events: Vec::new(),
            failures: Vec::new(),
        }
    }

    /// The number of base servers (the ones a plan's `server` indexes).
    pub fn base_servers(&self) -> usize {
        self.base.len()
    }

    /// Runs every step of `plan` at its time after `t0`; its events replace `events`.
    pub fn execute(&mut self, plan: &Plan, t0: Instant) {
        self.added = vec![None; plan.added];
        self.events = plan
            .events
            .iter()
            .map(|e| {
                let mut details = Map::new();
                details.insert("until_s".into(), json!(round3(e.until.as_secs_f64())));
                Event {
                    at_s: round3(e.at.as_secs_f64()),
                    kind: e.kind,
                    details,
                }
            })
            .collect();
        for (at, op) in &plan.ops {
            let now = Instant::now();
            if t0 + *at > now {
                std::thread::sleep(t0 + *at - now);
            }
            self.step(*op, t0);
        }
    }

    fn detail(&mut self, event: usize, key: &str, v: Value) {
        if let Some(e) = self.events.get_mut(event) {
            e.details.insert(key.into(), v);
        }
    }

    fn started(&mut self, event: usize, t0: Instant) {
        let at = round3(t0.elapsed().as_secs_f64());
        if let Some(e) = self.events.get_mut(event) {
            e.at_s = at;
            e.details
                .insert("rss_kib".into(), json!(super::measure::rss_kib()));
        }
    }

    fn step(&mut self, op: Op, t0: Instant) {
        match op {
            Op::Stop { event, server } => {
                self.started(event, t0);
                let (id, addr) = self.base[server];
                self.detail(event, "server_id", json!(id));
                self.detail(event, "addr", json!(addr.to_string()));
                if let Some(h) = self.take(id) {
                    stop(h);
                }
            }
            Op::Restart { event, server } => self.restart(event, server),
            Op::BurstOn { event, burst } => {
                self.started(event, t0);
                for (k, v) in burst_json(burst) {
                    self.detail(event, k, v);
                }
                self.bursts.push((event, burst));
                self.apply_faults();
            }
            Op::BurstOff { event } => {
                self.bursts.retain(|(e, _)| *e != event);
                self.apply_faults();
            }
            Op::Add { event, slot } => {
                self.started(event, t0);
                self.add(event, slot);
            }
            Op::Withdraw { event, slot } => {
                self.started(event, t0);
                if let Some(Some((id, addr, published))) = self.added.get_mut(slot) {
                    *published = false;
                    let (id, addr) = (*id, *addr);
                    self.detail(event, "server_id", json!(id));
                    self.detail(event, "addr", json!(addr.to_string()));
                }
                self.publish();
            }
            Op::Retire { slot, .. } => {
                if let Some((id, _, _)) = self.added.get_mut(slot).and_then(Option::take)
                    && let Some(h) = self.take(id)
                {
                    stop(h);
                }
            }
        }
    }

    /// Takes the running responder `id` out of the run's servers.
    fn take(&self, id: u64) -> Option<ResponderHandle> {
        let mut rs = self.servers.responders();
        let i = rs.iter().position(|r| r.server_id() == id)?;
        Some(rs.swap_remove(i))
    }

    /// Starts a responder with id `id` on `addr` (port 0: any) with the faults now in force.
    fn spawn(&mut self, index: usize, id: u64, addr: SocketAddr) -> Result<(), String> {
        let mut cfg =
            setup::responder_config(self.args, &self.servers.key, index, self.responder_cores);
        cfg.server_id = Some(id);
        cfg.listen = addr;
        cfg.faults = self.faults_for(id);
        // the old sockets are closed once `stop` returned; a bind can still race the
        // kernel's release of the port, so try a few times
        let mut last = String::new();
        for _ in 0..20 {
            match rl_responder::spawn(cfg.clone()) {
                Ok(h) => {
                    self.servers.responders().push(h);
                    return Ok(());
                }
                Err(e) => last = e.to_string(),
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Err(last)
    }

    fn restart(&mut self, event: usize, server: usize) {
        let (id, addr) = self.base[server];
        if let Err(e) = self.spawn(server, id, addr) {
            self.failures
                .push(format!("restart of server {id} on {addr}: {e}"));
            self.detail(event, "restart_failed", json!(e));
        }
    }

    fn add(&mut self, event: usize, slot: usize) {
        let index = self.base.len() + slot;
        let cfg =
            setup::responder_config(self.args, &self.servers.key, index, self.responder_cores);
        let id = cfg.server_id.unwrap_or(0);
        let any = SocketAddr::from(([127, 0, 0, 1], 0));
        if let Err(e) = self.spawn(index, id, any) {
            self.failures.push(format!("added server {id}: {e}"));
            return;
        }
        let addr = self
            .servers
            .responders()
            .iter()
            .find(|r| r.server_id() == id)
            .map(ResponderHandle::addr);
        if let Some(addr) = addr {
            self.added[slot] = Some((id, addr, true));
            self.detail(event, "server_id", json!(id));
            self.detail(event, "addr", json!(addr.to_string()));
        }
        self.publish();
    }

    /// Publishes the membership: every base server (a restarting one stays a member) and
    /// every added server not yet withdrawn.
    fn publish(&self) {
        let Some(dns) = self.servers.dns() else {
            return;
        };
        let mut members: Vec<(u64, Vec<SocketAddr>)> =
            self.base.iter().map(|(id, a)| (*id, vec![*a])).collect();
        for (id, addr, published) in self.added.iter().flatten() {
            if *published {
                members.push((*id, vec![*addr]));
            }
        }
        members.sort_by_key(|(id, _)| *id);
        dns.set_servers(members);
    }

    /// The faults of responder `id`: the options' faults with every burst in force on top.
    fn faults_for(&self, id: u64) -> Faults {
        let mut f = setup::base_faults(self.args, 0);
        f.seed ^= id;
        for (_, b) in &self.bursts {
            match *b {
                Burst::Steer(n) => f.steer_every = n,
                Burst::Loss(p) => f.drop_out = f.drop_out.max(p),
                Burst::Delay { delay, jitter } => {
                    f.delay = f.delay.max(delay);
                    f.jitter = f.jitter.max(jitter);
                }
                Burst::Duplicate(p) => f.duplicate = f.duplicate.max(p),
            }
        }
        f
    }

    fn apply_faults(&self) {
        for r in self.servers.responders().iter() {
            r.set_faults(self.faults_for(r.server_id()));
        }
    }
}

/// Stops a responder (its sockets are closed and its threads joined when this returns)
/// and hands the memory it freed back to the kernel ([`crate::memory::release_freed_memory`]).
fn stop(h: ResponderHandle) {
    h.stop();
    crate::memory::release_freed_memory();
}

fn burst_json(b: Burst) -> Vec<(&'static str, Value)> {
    match b {
        Burst::Steer(n) => vec![("steer_every", json!(n))],
        Burst::Loss(p) => vec![("drop", json!(round3(p)))],
        Burst::Delay { delay, jitter } => vec![
            ("delay_ms", json!(delay.as_millis() as u64)),
            ("jitter_ms", json!(jitter.as_millis() as u64)),
        ],
        Burst::Duplicate(p) => vec![("duplicate", json!(round3(p)))],
    }
}

pub fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}
