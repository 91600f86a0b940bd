//! Which addresses an HTTP upstream (or an MCP server over HTTP) may reach. Only globally
//! routable unicast addresses pass by default: no loopback, private, link-local, CGNAT, multicast,
//! unspecified, documentation or reserved ranges, and no IPv6 forms that embed one of those IPv4
//! addresses. An upstream can open every non-public range (`allow_private_addresses`) or just
//! some (`allow_private_cidrs`); cloud metadata endpoints stay closed either way unless an entry
//! names the exact address.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

use crate::settings::FieldError;

/// Which non-public addresses one upstream may reach.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AddressPolicy {
    /// Every non-public address except cloud metadata.
    allow_private: bool,
    /// Non-public ranges this upstream may reach.
    allow_cidrs: Vec<IpNet>,
}

impl AddressPolicy {
    /// Validates `allow_private_cidrs` entries (`10.1.2.0/24`, or a bare address).
    pub fn build(allow_private: bool, cidrs: &[String], at: &str) -> Result<Self, FieldError> {
        let allow_cidrs = cidrs
            .iter()
            .enumerate()
            .map(|(i, text)| {
                let text = text.trim();
                text.parse::<IpNet>()
                    .or_else(|_| text.parse::<IpAddr>().map(IpNet::from))
                    .map(|net| net.trunc())
                    .map_err(|_| {
                        FieldError::new(
                            format!("{at}[{i}]"),
                            format!(
                                "{text:?} is not a CIDR range such as 10.1.2.0/24 or an IP address"
                            ),
                        )
                    })
            })
            .collect::<Result<_, _>>()?;
        Ok(AddressPolicy {
            allow_private,
            allow_cidrs,
        })
    }

    /// Why `ip` may not be reached, or `None` when it may.
    pub fn refusal(&self, ip: IpAddr) -> Option<&'static str> {
        // An IPv6 form that reaches an IPv4 address is judged as that address.
        let reached = match ip {
            IpAddr::V6(v6) => embedded_v4(v6).map_or(ip, IpAddr::V4),
            IpAddr::V4(_) => ip,
        };
        let listed = |net: &IpNet| net.contains(&ip) || net.contains(&reached);
        if let Some(why) = metadata_reason(reached) {
            // Opened only by an entry that is exactly this address, never by a wider range.
            let named = self.allow_cidrs.iter().any(|net| {
                net.prefix_len() == net.max_prefix_len()
                    && (net.addr() == ip || net.addr() == reached)
            });
            return (!named).then_some(why);
        }
        let why = non_public_reason(ip)?;
        if self.allow_private || self.allow_cidrs.iter().any(listed) {
            None
        } else {
            Some(why)
        }
    }
}

/// Why an address is not public, for the error message.
pub fn non_public_reason(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => v4_reason(v4),
        IpAddr::V6(v6) => v6_reason(v6),
    }
}

/// Cloud metadata and platform endpoints: they hand out credentials to whoever asks from inside.
fn metadata_reason(ip: IpAddr) -> Option<&'static str> {
    const V4: [(Ipv4Addr, &str); 6] = [
        // AWS, GCP, Azure, OpenStack, Oracle, DigitalOcean instance metadata.
        (
            Ipv4Addr::new(169, 254, 169, 254),
            "link-local cloud metadata",
        ),
        // AWS ECS task metadata and EKS pod identity.
        (Ipv4Addr::new(169, 254, 170, 2), "link-local cloud metadata"),
        (
            Ipv4Addr::new(169, 254, 170, 23),
            "link-local cloud metadata",
        ),
        // Alibaba Cloud metadata.
        (Ipv4Addr::new(100, 100, 100, 200), "cloud metadata"),
        // Oracle Cloud Classic metadata.
        (Ipv4Addr::new(192, 0, 0, 192), "cloud metadata"),
        // Azure's platform endpoint (WireServer): public-looking, but answers only from inside.
        (Ipv4Addr::new(168, 63, 129, 16), "cloud platform metadata"),
    ];
    const V6: [Ipv6Addr; 2] = [
        // AWS instance metadata and EKS pod identity over IPv6.
        Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254),
        Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x23),
    ];
    match ip {
        IpAddr::V4(v4) => V4.iter().find(|(m, _)| *m == v4).map(|(_, why)| *why),
        IpAddr::V6(v6) => V6.contains(&v6).then_some("unique local cloud metadata"),
    }
}

/// The IPv4 address an IPv4-mapped (::ffff:a.b.c.d), IPv4-compatible (::a.b.c.d) or NAT64
/// (64:ff9b::/96) address reaches.
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return Some(v4);
    }
    let segments = ip.segments();
    let compatible =
        segments[..6] == [0, 0, 0, 0, 0, 0] && !ip.is_unspecified() && !ip.is_loopback();
    let nat64 = segments[..6] == [0x64, 0xff9b, 0, 0, 0, 0];
    (compatible || nat64).then(|| Ipv4Addr::from(ip.to_bits() as u32))
}

fn v4_reason(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    Some(match (a, b, c) {
        _ if ip.is_unspecified() || a == 0 => "unspecified",
        _ if ip.is_loopback() => "loopback",
        _ if ip.is_private() => "private",
        (169, 254, _) => "link-local",
        (100, 64..=127, _) => "carrier-grade NAT",
        _ if ip.is_multicast() => "multicast",
        _ if ip.is_broadcast() => "broadcast",
        (192, 0, 0) => "IETF protocol assignment",
        (192, 0, 2) | (198, 51, 100) | (203, 0, 113) => "documentation",
        (198, 18..=19, _) => "benchmarking",
        (240..=255, _, _) => "reserved",
        _ => return None,
    })
}

fn v6_reason(ip: Ipv6Addr) -> Option<&'static str> {
    if let Some(v4) = embedded_v4(ip) {
        return v4_reason(v4);
    }
    let segments = ip.segments();
    Some(match segments[0] {
        _ if ip.is_unspecified() => "unspecified",
        _ if ip.is_loopback() => "loopback",
        s if s & 0xfe00 == 0xfc00 => "unique local (private)",
        s if s & 0xffc0 == 0xfe80 => "link-local",
        s if s & 0xffc0 == 0xfec0 => "site-local",
        s if s & 0xff00 == 0xff00 => "multicast",
        0x2001 if segments[1] == 0x0db8 => "documentation",
        0x0100 if segments[1..4] == [0, 0, 0] => "discard-only",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(text: &str) -> bool {
        non_public_reason(text.parse().unwrap()).is_some()
    }

    #[test]
    fn non_public_addresses_are_refused() {
        for ip in [
            "127.0.0.1",
            "127.8.9.10",
            "10.1.2.3",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "100.127.255.254",
            "0.0.0.0",
            "0.1.2.3",
            "224.0.0.1",
            "255.255.255.255",
            "240.0.0.1",
            "192.0.2.1",
            "198.18.0.1",
            "::1",
            "::",
            "fd00:ec2::254",
            "fc00::1",
            "fe80::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::ffff:10.0.0.1",
            "::127.0.0.1",
            "64:ff9b::a9fe:a9fe",
            "2001:db8::1",
            "fec0::1",
        ] {
            assert!(refused(ip), "{ip} should be refused");
        }
    }

    #[test]
    fn public_addresses_pass() {
        for ip in [
            "8.8.8.8",
            "1.1.1.1",
            "172.32.0.1",
            "100.128.0.1",
            "192.0.3.1",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
        ] {
            assert!(!refused(ip), "{ip} should pass");
        }
    }

    fn policy(allow_private: bool, cidrs: &[&str]) -> AddressPolicy {
        let cidrs: Vec<String> = cidrs.iter().map(|c| c.to_string()).collect();
        AddressPolicy::build(allow_private, &cidrs, "p").unwrap()
    }

    fn allowed(policy: &AddressPolicy, ip: &str) -> bool {
        policy.refusal(ip.parse().unwrap()).is_none()
    }

    #[test]
    fn a_cidr_opens_its_range_only() {
        let one = policy(false, &["10.1.2.0/24", "fd12::/16"]);
        for ip in [
            "10.1.2.3",
            "10.1.2.255",
            "::ffff:10.1.2.9",
            "fd12::1",
            "8.8.8.8",
        ] {
            assert!(allowed(&one, ip), "{ip} should pass");
        }
        for ip in ["10.1.3.1", "127.0.0.1", "192.168.1.1", "fd13::1"] {
            assert!(!allowed(&one, ip), "{ip} should be refused");
        }
        // Host bits are ignored, a bare address is a /32.
        assert!(allowed(&policy(false, &["10.1.2.77/24"]), "10.1.2.1"));
        assert!(allowed(&policy(false, &["10.9.9.9"]), "10.9.9.9"));
        assert!(!allowed(&policy(false, &["10.9.9.9"]), "10.9.9.8"));
    }

    #[test]
    fn metadata_stays_closed_unless_named_exactly() {
        for ip in [
            "169.254.169.254",
            "::ffff:169.254.169.254",
            "64:ff9b::a9fe:a9fe",
            "169.254.170.2",
            "169.254.170.23",
            "fd00:ec2::254",
            "fd00:ec2::23",
            "::ffff:169.254.170.23",
            "100.100.100.200",
            "192.0.0.192",
            "168.63.129.16",
        ] {
            for p in [
                policy(false, &[]),
                policy(true, &[]),
                policy(
                    false,
                    &[
                        "169.254.0.0/16",
                        "fd00::/8",
                        "100.64.0.0/10",
                        "192.0.0.0/24",
                        "0.0.0.0/0",
                    ],
                ),
            ] {
                assert!(!allowed(&p, ip), "{ip} should be refused by {p:?}");
            }
        }
        assert!(allowed(
            &policy(false, &["169.254.169.254/32"]),
            "169.254.169.254"
        ));
        assert!(allowed(
            &policy(false, &["169.254.169.254"]),
            "::ffff:169.254.169.254"
        ));
        assert!(allowed(&policy(false, &["fd00:ec2::254"]), "fd00:ec2::254"));
        // Other link-local addresses follow the ordinary rules.
        assert!(allowed(&policy(true, &[]), "169.254.1.1"));
        assert!(allowed(&policy(false, &["169.254.0.0/16"]), "169.254.1.1"));
    }

    #[test]
    fn bad_cidr_entries_are_load_errors() {
        for bad in ["10.0.0.0/33", "ten", "10.0.0.0/8/8", ""] {
            let err = AddressPolicy::build(false, &[bad.to_owned()], "u.allow_private_cidrs")
                .unwrap_err();
            assert_eq!(err.path, "u.allow_private_cidrs[0]", "{bad}");
        }
    }
}
