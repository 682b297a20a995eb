//! Checks across options, made right after parsing so that a run that cannot work fails
//! with the usage text before anything starts: the policy (`--unit-ms`, `--replays`,
//! `--schedule`, `--final`) must build, and for embedded runs fit the fixture key's dedup
//! limit; one request (`--resources`, `--guards`, `--label`) must fit one datagram.
//!
//! Owns these rules' wording. Must not touch sockets, responders or clients. The external
//! key is not known at parse time: its dedup limit is checked when it is loaded.

use ratelimitly_engine::proto::key::ApiKey;
use ratelimitly_engine::proto::wire::{Auth, rate_request_pdu_len};

use super::{Args, AuthArg};

/// Why the options together describe no valid run, or `Ok`.
pub fn check(args: &Args) -> Result<(), String> {
    let policy = args
        .policy()
        .map_err(|e| format!("--unit-ms, --replays, --schedule, --final: {e}"))?;
    let keys: Vec<ApiKey> = if args.external() {
        // the key's mode is not known yet: the request must fit the mode with the
        // largest auth overhead
        [AuthArg::Aes, AuthArg::Cookie, AuthArg::None]
            .iter()
            .map(|a| rl_testkit::keys::key(a.fixture()))
            .collect()
    } else {
        let key = rl_testkit::keys::key(args.auth.fixture());
        policy.check_key(&key).map_err(|e| {
            format!("--unit-ms, --replays, --schedule, --final with the embedded key: {e}")
        })?;
        vec![key]
    };
    let room = keys
        .iter()
        .map(|k| Auth::new(k).max_pdu_len())
        .min()
        .unwrap_or(0);
    match rate_request_pdu_len(args.guards, args.resources, args.label.len()) {
        Some(len) if len <= room => Ok(()),
        need => Err(format!(
            "--resources {} --guards {} --label of {} bytes need a {}-byte request PDU; one \
             datagram holds {room}",
            args.resources,
            args.guards,
            args.label.len(),
            need.map_or_else(|| "too long a".to_owned(), |n| n.to_string()),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn checked(args: &[&str]) -> Result<(), String> {
        let argv = std::iter::once("loadgen").chain(args.iter().copied());
        check(&Args::try_parse_from(argv).unwrap())
    }

    #[test]
    fn runs_that_cannot_work_are_refused_before_they_start() {
        assert_eq!(checked(&[]), Ok(()));
        assert_eq!(checked(&["--resources", "8", "--guards", "8"]), Ok(()));
        let e = checked(&["--unit-ms", "0"]).unwrap_err();
        assert!(e.contains("at least 1 ms"), "{e}");
        let e = checked(&["--unit-ms", "200"]).unwrap_err();
        assert!(
            e.contains("exceeds the key's dedup TTL limit 300 ms"),
            "{e}"
        );
        let e = checked(&["--resources", "64"]).unwrap_err();
        assert!(e.contains("one datagram holds"), "{e}");
        let e = checked(&["--resources", "30", "--guards", "10"]).unwrap_err();
        assert!(e.contains("one datagram holds"), "{e}");
    }
}
