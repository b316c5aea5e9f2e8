//! Which addresses a callback may go to. A tenant's URL must not become a probe of our own
//! network, so loopback, private, link-local and other non-public ranges are refused unless
//! configuration allows them. Hostnames are checked at connect time by the resolver, so a name
//! cannot pass a check and then resolve elsewhere.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// Why an address is refused, or `None` when it is public.
pub fn refusal(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => refusal_v4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => refusal_v4(v4),
            None => refusal_v6(v6),
        },
    }
}

fn refusal_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, ..] = ip.octets();
    if ip.is_loopback() {
        Some("loopback address")
    } else if ip.is_private() {
        Some("private address")
    } else if ip.is_link_local() {
        Some("link-local address")
    } else if ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast() || a == 0 {
        Some("non-routable address")
    } else if a == 100 && (64..128).contains(&b) {
        Some("shared address space (carrier-grade NAT)")
    } else if ip.is_documentation() || (a == 198 && (b == 18 || b == 19)) || a >= 240 {
        Some("reserved address")
    } else {
        None
    }
}

fn refusal_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let first = ip.segments()[0];
    if ip.is_loopback() {
        Some("loopback address")
    } else if ip.is_unspecified() || ip.is_multicast() {
        Some("non-routable address")
    } else if first & 0xfe00 == 0xfc00 {
        Some("unique local (private) address")
    } else if first & 0xffc0 == 0xfe80 {
        Some("link-local address")
    } else if first == 0x2001 && ip.segments()[1] == 0x0db8 {
        Some("reserved address")
    } else {
        None
    }
}

/// A resolver that drops refused addresses and fails when none is left.
pub struct GuardedResolver;

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let resolved: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let allowed: Vec<SocketAddr> = resolved
                .iter()
                .copied()
                .filter(|a| refusal(a.ip()).is_none())
                .collect();
            if allowed.is_empty() {
                let why = resolved
                    .first()
                    .and_then(|a| refusal(a.ip()))
                    .unwrap_or("no address");
                return Err(format!("destination refused: {host} resolves to a {why}").into());
            }
            Ok(Box::new(allowed.into_iter()) as Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_ranges_are_refused_and_public_ones_allowed() {
        for refused in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "::1",
            "fe80::1",
            "fd00::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "224.0.0.1",
            "255.255.255.255",
        ] {
            assert!(refusal(refused.parse().unwrap()).is_some(), "{refused}");
        }
        for allowed in ["93.184.216.34", "8.8.8.8", "2606:4700::1111", "1.1.1.1"] {
            assert_eq!(refusal(allowed.parse().unwrap()), None, "{allowed}");
        }
    }
}
