//! The one text form of each concept the tools take on their command lines, tested once:
//! endpoints `ID@IP:PORT` (`ratelimitly_engine::proto::endpoint`) and replay-gap schedules
//! (`Schedule`'s `FromStr`/`Display` in `ratelimitly_engine::proto::policy`). Display then parse
//! gives back the same value, and the canonical text is a fixed point.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};

use proptest::prelude::*;
use ratelimitly_engine::proto::endpoint::{Endpoint, EndpointParseError};
use ratelimitly_engine::proto::policy::{Schedule, ScheduleParseError};

fn endpoint() -> impl Strategy<Value = Endpoint> {
    let v4 = any::<u32>().prop_map(|ip| std::net::IpAddr::V4(Ipv4Addr::from(ip)));
    let v6 = any::<u128>().prop_map(|ip| std::net::IpAddr::V6(Ipv6Addr::from(ip)));
    (1..=u64::MAX, prop_oneof![v4, v6], 1..=u16::MAX).prop_map(|(server_id, ip, port)| Endpoint {
        server_id,
        addr: SocketAddr::new(ip, port),
    })
}

fn schedule() -> impl Strategy<Value = Schedule> {
    prop_oneof![
        any::<u32>().prop_map(Schedule::Fixed),
        (any::<u32>(), any::<u32>(), any::<u32>())
            .prop_map(|(initial, step, max)| Schedule::Linear { initial, step, max }),
        (any::<u32>(), any::<u32>(), any::<u32>()).prop_map(|(initial, factor, max)| {
            Schedule::Exponential {
                initial,
                factor,
                max,
            }
        }),
    ]
}

proptest! {
    #[test]
    fn endpoint_round_trips(e in endpoint()) {
        let text = e.to_string();
        let back: Endpoint = text.parse().unwrap();
        prop_assert_eq!(back, e);
        prop_assert_eq!(back.to_string(), text);
    }

    #[test]
    fn schedule_round_trips(s in schedule()) {
        let text = s.to_string();
        let back: Schedule = text.parse().unwrap();
        prop_assert_eq!(back, s);
        prop_assert_eq!(back.to_string(), text);
    }

    #[test]
    fn arbitrary_text_never_panics(text in "\\PC{0,40}") {
        let _ = text.parse::<Endpoint>();
        let _ = text.parse::<Schedule>();
    }
}

#[test]
fn endpoint_grammar() {
    use EndpointParseError::*;
    let e: Endpoint = "7@127.0.0.1:4000".parse().unwrap();
    assert_eq!(
        (e.server_id, e.addr),
        (7, "127.0.0.1:4000".parse().unwrap())
    );
    let e: Endpoint = "7@[::1]:4000".parse().unwrap();
    assert_eq!(e.server_id, 7);
    assert_eq!(e.to_string(), "7@[::1]:4000");
    let e: Endpoint = "18446744073709551615@[::1]:5".parse().unwrap();
    assert_eq!(e.server_id, u64::MAX);
    for (text, err) in [
        ("+5@127.0.0.1:1", BadServerId),
        ("-5@127.0.0.1:1", BadServerId),
        ("05@127.0.0.1:1", BadServerId),
        ("0@127.0.0.1:1", BadServerId),
        (" 5@127.0.0.1:1", BadServerId),
        ("@127.0.0.1:1", BadServerId),
        ("18446744073709551616@127.0.0.1:1", BadServerId),
        ("5-127.0.0.1:1", MissingAt),
        ("5@::1:1", BadAddress),
        ("5@127.0.0.1", BadAddress),
        ("5@localhost:1", BadAddress),
        ("5@127.0.0.1:1 ", BadAddress),
        ("5@127.0.0.1:0", PortZero),
    ] {
        assert_eq!(text.parse::<Endpoint>(), Err(err), "{text}");
    }
}

#[test]
fn schedule_grammar() {
    assert_eq!("fixed:2".parse(), Ok(Schedule::Fixed(2)));
    assert_eq!(
        "exponential:1,2,4"
            .parse::<Schedule>()
            .map(|s| s.to_string()),
        Ok("exp:1,2,4".to_string())
    );
    // Syntax only: the domain (factor >= 2, ...) is the policy builder's.
    assert!("exp:1,1,4".parse::<Schedule>().is_ok());
    assert_eq!(
        "poisson:1".parse::<Schedule>(),
        Err(ScheduleParseError::UnknownKind)
    );
    assert_eq!(
        "fixed".parse::<Schedule>(),
        Err(ScheduleParseError::UnknownKind)
    );
    for bad in [
        "fixed:1,2",
        "fixed:+1",
        "fixed: 1",
        "linear:1,2",
        "exp:1,2,x",
        "fixed:",
    ] {
        assert!(
            matches!(
                bad.parse::<Schedule>(),
                Err(ScheduleParseError::BadValues { .. })
            ),
            "{bad}"
        );
    }
}
