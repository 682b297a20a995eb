//! The trusted networks: whose forwarded headers are read at all.
//!
//! Owns: [`TrustedProxies`] and its CIDR-list syntax. Must not touch: headers.

use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;

use super::parse::canonical;

/// Networks whose peers' forwarded headers are believed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TrustedProxies {
    nets: Vec<IpNet>,
}

/// A CIDR (or plain address) that could not be parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrustedProxiesError(pub String);

impl std::fmt::Display for TrustedProxiesError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "not a CIDR or IP address: {:?}", self.0)
    }
}

impl std::error::Error for TrustedProxiesError {}

impl TrustedProxies {
    /// Trusts nobody: forwarded headers are ignored.
    pub fn none() -> Self {
        Self::default()
    }

    /// Trusts `nets`.
    pub fn new(nets: impl IntoIterator<Item = IpNet>) -> Self {
        TrustedProxies {
            nets: nets.into_iter().collect(),
        }
    }

    /// Trusts loopback (`127.0.0.0/8`, `::1/128`): a proxy on the same host.
    pub fn loopback() -> Self {
        "127.0.0.0/8,::1/128".parse().expect("valid CIDRs")
    }

    /// Also trusts `net`.
    pub fn with(mut self, net: IpNet) -> Self {
        self.nets.push(net);
        self
    }

    /// The trusted networks.
    pub fn nets(&self) -> &[IpNet] {
        &self.nets
    }

    /// Nobody is trusted.
    pub fn is_empty(&self) -> bool {
        self.nets.is_empty()
    }

    /// `ip` is in a trusted network (an IPv4-mapped IPv6 address counts as its IPv4).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = canonical(ip);
        self.nets.iter().any(|n| n.contains(&ip))
    }
}

impl FromStr for TrustedProxies {
    type Err = TrustedProxiesError;

    /// Comma-separated CIDRs or addresses (`10.0.0.0/8, 192.168.1.7, fd00::/8`); an
    /// empty string trusts nobody.
    fn from_str(s: &str) -> Result<Self, TrustedProxiesError> {
        let mut nets = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let net = match part.parse::<IpNet>() {
                Ok(n) => n,
                Err(_) => part
                    .parse::<IpAddr>()
                    .map(IpNet::from)
                    .map_err(|_| TrustedProxiesError(part.to_owned()))?,
            };
            nets.push(net);
        }
        Ok(TrustedProxies { nets })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trusted_list_syntax() {
        assert!("".parse::<TrustedProxies>().unwrap().is_empty());
        assert_eq!(
            "10.0.0.0/8,::1"
                .parse::<TrustedProxies>()
                .unwrap()
                .nets()
                .len(),
            2
        );
        assert!("10.0.0.0/33".parse::<TrustedProxies>().is_err());
        assert!("example.com".parse::<TrustedProxies>().is_err());
        // IPv4-mapped peers count as IPv4
        assert!(TrustedProxies::loopback().contains("::ffff:127.0.0.1".parse().unwrap()));
    }

    proptest::proptest! {
        #[test]
        fn the_list_parser_never_panics(s in "[ -~]{0,120}") {
            let _ = s.parse::<TrustedProxies>();
        }
    }
}
