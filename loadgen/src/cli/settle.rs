//! What the parsed options mean: the settled placement of the engine's core, the raw
//! client's way of waiting, the request policy, and the parse that checks options
//! together and fails once with the usage text.
//!
//! Owns: `impl Args`. Must not touch: the flags' declarations (`mod.rs`).

use std::time::Duration;

use clap::Parser;

use ratelimitly_engine::proto::policy::{PolicyError, RequestPolicy};
use ratelimitly_engine::udp::BackendChoice;

use super::{Args, EngineCore, RawWait, checks};

impl Args {
    /// Where the engine's core runs, `--engine-core auto` settled.
    pub fn placement(&self) -> EngineCore {
        match (self.engine_core, self.io) {
            (EngineCore::Auto, BackendChoice::Mmsg) => EngineCore::Hosted,
            (EngineCore::Auto, _) => EngineCore::Pinned,
            (chosen, _) => chosen,
        }
    }

    /// The options as the run uses them: `--chaos` raises a warm-up shorter than
    /// [`crate::chaos::MIN_WARMUP_S`] to it (the JSON's `warmup_s` is the one used).
    pub fn settled(mut self) -> Self {
        if self.chaos && self.warmup < crate::chaos::MIN_WARMUP_S {
            self.warmup = crate::chaos::MIN_WARMUP_S;
        }
        self
    }

    /// Parses the command line and checks the options together (the policy, the
    /// datagram size: [`checks`]). Any error is printed once, with the usage text, and
    /// exits 2 before anything starts.
    pub fn parse_checked() -> Self {
        use clap::CommandFactory;
        use clap::error::ErrorKind;
        let fail = |kind: ErrorKind, text: &str| -> ! {
            Args::command().error(kind, text).exit();
        };
        let args = match Args::try_parse() {
            Ok(a) => a,
            // clap's own message, its first line, now with the usage text
            Err(e) if e.use_stderr() => {
                let text = e.to_string();
                let first = text.lines().next().unwrap_or_default();
                fail(e.kind(), first.trim_start_matches("error: "))
            }
            Err(e) => e.exit(), // --help, --version
        };
        if let Err(e) = checks::check(&args) {
            fail(ErrorKind::ValueValidation, &e);
        }
        args
    }

    /// How the raw client waits: busy-polls only closed loop with `--raw-busy-poll`; it
    /// waits otherwise (alone and in `--compare`, so that `ratios.engine_vs_raw` compares
    /// work with work).
    pub fn raw_wait(&self) -> RawWait {
        if self.raw_busy_poll && self.rate.is_none() {
            RawWait::BusyPoll
        } else {
            RawWait::Sleep
        }
    }

    /// The engine's request policy these options describe.
    pub fn policy(&self) -> Result<RequestPolicy, PolicyError> {
        RequestPolicy::builder()
            .unit(Duration::from_millis(u64::from(self.unit_ms)))
            .replays(self.replays)
            .schedule(self.schedule)
            .final_units(self.final_units)
            .completion_delivery(!self.no_completion_delivery)
            .build()
    }

    /// True when the servers are external (--endpoint or --domain).
    pub fn external(&self) -> bool {
        !self.endpoints.is_empty() || self.domain.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::ClientKind;
    use crate::cli::CoreList;
    use crate::cli::values::parse_cores;
    use ratelimitly_engine::proto::policy::Schedule;

    #[test]
    fn cores_and_endpoints_parse() {
        assert_eq!(parse_cores("0,2-4"), Ok(CoreList(vec![0, 2, 3, 4])));
        assert!(parse_cores("3-1").is_err());
        let a = Args::try_parse_from(["loadgen", "--endpoint", "7@127.0.0.1:9000"]).unwrap();
        assert_eq!(a.endpoints[0].to_string(), "7@127.0.0.1:9000");
        for bad in ["0@127.0.0.1:1", "+5@127.0.0.1:1"] {
            assert!(Args::try_parse_from(["loadgen", "--endpoint", bad]).is_err());
        }
    }

    #[test]
    fn auto_placement_is_the_cheaper_one_of_each_backend() {
        let core = |args: &[&str]| {
            let argv = std::iter::once("loadgen").chain(args.iter().copied());
            Args::try_parse_from(argv).unwrap().placement()
        };
        assert_eq!(core(&[]), EngineCore::Hosted);
        assert_eq!(core(&["--io", "uring"]), EngineCore::Pinned);
        assert_eq!(core(&["--io", "auto"]), EngineCore::Pinned);
        assert_eq!(core(&["--engine-core", "pinned"]), EngineCore::Pinned);
        assert_eq!(
            core(&["--io", "uring", "--engine-core", "hosted"]),
            EngineCore::Hosted
        );
    }

    #[test]
    fn the_raw_client_waits_unless_busy_polling_is_asked_for_closed_loop() {
        let wait = |args: &[&str]| {
            let argv = std::iter::once("loadgen").chain(args.iter().copied());
            Args::try_parse_from(argv).map(|a| a.raw_wait())
        };
        assert_eq!(wait(&[]).unwrap(), RawWait::Sleep);
        assert_eq!(wait(&["--raw-sleep"]).unwrap(), RawWait::Sleep);
        assert_eq!(wait(&["--raw-busy-poll"]).unwrap(), RawWait::BusyPoll);
        let open = ["--raw-busy-poll", "--rate", "100"];
        assert_eq!(wait(&open).unwrap(), RawWait::Sleep);
        assert!(wait(&["--raw-sleep", "--raw-busy-poll"]).is_err());
    }

    #[test]
    fn defaults_parse() {
        let a = Args::try_parse_from(["loadgen"]).unwrap();
        assert_eq!(a.servers, 2);
        assert_eq!(a.client, ClientKind::Engine);
        assert!(!a.compare);
        assert_eq!(a.schedule, Schedule::Fixed(1));
        assert_eq!(
            (a.io, a.gso, a.reply_batch),
            (BackendChoice::Mmsg, true, true)
        );
        let a = Args::try_parse_from(["loadgen", "--io", "uring", "--gso", "off"]).unwrap();
        assert_eq!((a.io, a.gso), (BackendChoice::Uring, false));
        assert!(Args::try_parse_from(["loadgen", "--gso", "yes"]).is_err());
        assert!(Args::try_parse_from(["loadgen", "--io", "epoll"]).is_err());
    }

    #[test]
    fn out_of_range_values_are_rejected_not_clamped() {
        for args in [
            ["--loss", "1.5"],
            ["--loss", "-0.1"],
            ["--loss", "NaN"],
            ["--report-share", "2"],
            ["--duration", "0"],
            ["--warmup", "-1"],
            ["--in-flight", "0"],
            ["--servers", "0"],
            ["--buckets", "0"],
            ["--window-ms", "0"],
            ["--rate-limit", "0"],
            ["--rate", "0"],
            ["--batch", "0"],
            ["--batch", "1025"],
            ["--schedule", "fixed:+1"],
        ] {
            let r = Args::try_parse_from(["loadgen", args[0], args[1]]);
            assert!(r.is_err(), "{args:?} accepted");
        }
        let a =
            Args::try_parse_from(["loadgen", "--loss", "1", "--schedule", "exp:1,2,4"]).unwrap();
        assert_eq!(a.loss, 1.0);
        assert_eq!(a.schedule.to_string(), "exp:1,2,4");
    }
}
