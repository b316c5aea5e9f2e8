//! Which addresses a callback may go to. A tenant's URL must not become a probe of our own
//! network, so every address that is not public unicast is refused unless configuration allows
//! its kind. The guard runs in three places, all with the same [`DestinationPolicy`]:
//!
//! 1. when a URL is set ([`CallbackUrl::parse`]): an IP literal or a `localhost` name that the
//!    policy refuses never gets stored, and the error says why;
//! 2. before each attempt ([`check_url`]) on the URL exactly as reqwest will use it, since
//!    reqwest connects to IP literals without asking a resolver, and a URL may have been stored
//!    under another policy;
//! 3. at connect time ([`GuardedResolver`]): every address a name resolves to, so a name cannot
//!    pass a check and then resolve (or rebind) elsewhere.
//!
//! What the settings open (see [`Range`]): `allow_private` opens loopback, RFC 1918, carrier-grade
//! NAT, unique-local and site-local addresses and `localhost` names (tests use it to reach
//! 127.0.0.1); `allow_link_local` alone opens link-local addresses and the cloud metadata
//! endpoints. Nothing opens the rest (unspecified, broadcast, multicast, documentation,
//! benchmarking, reserved, tunnel and translation forms).
//!
//! Addresses that embed an IPv4 address are judged by it: an IPv4-mapped address
//! (`::ffff:a.b.c.d`) is that IPv4 address to the kernel, and a NAT64 address under the
//! well-known prefix `64:ff9b::/96` (what DNS64 returns for IPv4-only hosts) reaches its embedded
//! address through a translator, so both pass when the embedded address is public. The
//! deprecated IPv4-compatible (`::/96`) and 6to4 (`2002::/16`) forms, Teredo (`2001::/32`) and
//! the local-use NAT64 prefix (`64:ff9b:1::/48`) are refused whatever they embed; the error names
//! the embedded address when it is itself internal.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// What kinds of non-public destination configuration allows.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DestinationPolicy {
    /// Loopback, private (RFC 1918, CGNAT, unique-local, site-local) and `localhost` names.
    pub allow_private: bool,
    /// Link-local addresses and cloud metadata endpoints; never implied by `allow_private`.
    pub allow_link_local: bool,
}

/// The kind of a refused address: which setting, if any, allows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Range {
    /// Allowed by `allow_private`.
    Private,
    /// Allowed by `allow_link_local` only.
    LinkLocal,
    /// Never allowed.
    Reserved,
}

/// Why a destination is not public.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The host as written or resolved.
    pub host: String,
    pub range: Range,
    /// What kind of address it is, e.g. "a loopback address".
    pub what: &'static str,
    /// The IPv4 address it embeds, and what kind that is, when that is the reason.
    pub embedded: Option<(Ipv4Addr, &'static str)>,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} is {}", self.host, self.what)?;
        if let Some((v4, what)) = self.embedded {
            write!(f, " embedding {v4}, {what}")?;
        }
        Ok(())
    }
}

impl DestinationPolicy {
    /// Why this policy refuses `ip`, or `None` when it may be reached.
    pub fn refusal(&self, ip: IpAddr) -> Option<Refusal> {
        classify(ip).filter(|r| !self.allows(r.range))
    }

    /// Why this policy refuses a host name without resolving it (`localhost`, `*.localhost`).
    pub fn name_refusal(&self, name: &str) -> Option<Refusal> {
        let name = name.trim_end_matches('.').to_ascii_lowercase();
        let local = name == "localhost" || name.ends_with(".localhost");
        (local && !self.allow_private).then_some(Refusal {
            host: name,
            range: Range::Private,
            what: "a loopback name",
            embedded: None,
        })
    }

    fn allows(&self, range: Range) -> bool {
        match range {
            Range::Private => self.allow_private,
            Range::LinkLocal => self.allow_link_local,
            Range::Reserved => false,
        }
    }
}

/// What `ip` is when it is not public unicast, whatever the policy.
pub fn classify(ip: IpAddr) -> Option<Refusal> {
    let kind = match ip {
        IpAddr::V4(v4) => classify_v4(v4).map(|(range, what)| (range, what, None)),
        IpAddr::V6(v6) => classify_v6(v6),
    };
    kind.map(|(range, what, embedded)| Refusal {
        host: ip.to_string(),
        range,
        what,
        embedded,
    })
}

fn classify_v4(ip: Ipv4Addr) -> Option<(Range, &'static str)> {
    let [a, b, c, d] = ip.octets();
    let kind = match (a, b, c) {
        _ if ip.is_unspecified() => (Range::Reserved, "an unspecified address"),
        _ if ip.is_broadcast() => (Range::Reserved, "a broadcast address"),
        (0, ..) => (Range::Reserved, "a \"this network\" address (0.0.0.0/8)"),
        (127, ..) => (Range::Private, "a loopback address"),
        (10, ..) | (172, 16..=31, _) | (192, 168, _) => {
            (Range::Private, "a private (RFC 1918) address")
        }
        (169, 254, _) => (Range::LinkLocal, "a link-local (cloud metadata) address"),
        // Alibaba Cloud's metadata endpoint sits in the shared range below.
        (100, 100, 100) if d == 200 => (Range::LinkLocal, "a cloud metadata address"),
        (100, 64..=127, _) => (Range::Private, "a shared (carrier-grade NAT) address"),
        (192, 0, 0) => (
            Range::Reserved,
            "an IETF protocol assignment (192.0.0.0/24)",
        ),
        (192, 0, 2) | (198, 51, 100) | (203, 0, 113) => {
            (Range::Reserved, "a documentation address")
        }
        (198, 18..=19, _) => (Range::Reserved, "a benchmarking address"),
        (192, 88, 99) => (Range::Reserved, "a 6to4 relay anycast address"),
        (224..=239, ..) => (Range::Reserved, "a multicast address"),
        (240..=255, ..) => (Range::Reserved, "a reserved address"),
        _ => return None,
    };
    Some(kind)
}

type V6Kind = (Range, &'static str, Option<(Ipv4Addr, &'static str)>);

fn classify_v6(ip: Ipv6Addr) -> Option<V6Kind> {
    let s = ip.segments();
    let last32 = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    // A form judged by its embedded IPv4 address. The kernel connects to a mapped address as
    // to the IPv4 one, so the same settings apply; a translator must never be asked for an
    // internal address, so an internal NAT64 address is never allowed.
    let judged = |what, mapped: bool| {
        classify_v4(last32).map(|(range, v4what)| {
            let range = if mapped { range } else { Range::Reserved };
            (range, what, Some((last32, v4what)))
        })
    };
    // A form refused whatever it embeds; the embedded address is named when it is internal.
    let refused = |what, v4: Option<Ipv4Addr>| {
        let embedded = v4.and_then(|v4| classify_v4(v4).map(|(_, w)| (v4, w)));
        Some((Range::Reserved, what, embedded))
    };
    let kind = if ip.is_unspecified() {
        (Range::Reserved, "an unspecified address", None)
    } else if ip.is_loopback() {
        (Range::Private, "a loopback address", None)
    } else if s[..5] == [0; 5] && s[5] == 0xffff {
        return judged("an IPv4-mapped address", true);
    } else if s[..6] == [0; 6] {
        return refused("an IPv4-compatible address (deprecated)", Some(last32));
    } else if s[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return judged("a NAT64 address", false);
    } else if s[..3] == [0x64, 0xff9b, 1] {
        return refused("a local-use NAT64 address (64:ff9b:1::/48)", None);
    } else if s[..4] == [0x100, 0, 0, 0] {
        (Range::Reserved, "a discard-only address", None)
    } else if s[0] == 0x2002 {
        let v4 = Ipv4Addr::new((s[1] >> 8) as u8, s[1] as u8, (s[2] >> 8) as u8, s[2] as u8);
        return refused("a 6to4 address", Some(v4));
    } else if s[0] == 0x2001 && s[1] == 0 {
        (Range::Reserved, "a Teredo address", None)
    } else if s[0] == 0x2001 && s[1] == 0x0db8 || s[0] == 0x3fff && s[1] < 0x1000 {
        (Range::Reserved, "a documentation address", None)
    } else if s[0] == 0x2001 && s[1] < 0x200 {
        (
            Range::Reserved,
            "an IETF protocol assignment (2001::/23)",
            None,
        )
    } else if ip == Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254) {
        (Range::LinkLocal, "a cloud metadata address", None)
    } else if s[0] & 0xfe00 == 0xfc00 {
        (Range::Private, "a unique local (private) address", None)
    } else if s[0] & 0xffc0 == 0xfe80 {
        (Range::LinkLocal, "a link-local address", None)
    } else if s[0] & 0xffc0 == 0xfec0 {
        (Range::Private, "a site-local address (deprecated)", None)
    } else if s[0] & 0xff00 == 0xff00 {
        (Range::Reserved, "a multicast address", None)
    } else if s[0] & 0xe000 != 0x2000 {
        // Outside 2000::/3, the only global unicast block assigned.
        (Range::Reserved, "a reserved address", None)
    } else {
        return None;
    };
    Some(kind)
}

/// A callback URL refused by the guard.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    #[error("the callback URL must be an absolute http(s) URL with a host")]
    NotHttp,
    #[error("the callback URL is refused: {0}{hint}", hint = hint(.0.range))]
    Refused(Refusal),
}

fn hint(range: Range) -> &'static str {
    match range {
        Range::Private => {
            " (set VERDICT_ALLOW_PRIVATE_DESTINATIONS=1 only if callbacks must reach your own network)"
        }
        Range::LinkLocal => {
            " (link-local addresses are refused even with VERDICT_ALLOW_PRIVATE_DESTINATIONS; \
             VERDICT_ALLOW_LINK_LOCAL_DESTINATIONS=1 allows them)"
        }
        Range::Reserved => "",
    }
}

/// Checks a parsed URL as reqwest will use it: an http(s) URL whose host, if an IP literal or a
/// `localhost` name, the policy allows. Other names are checked when they resolve.
pub fn check_url(url: &url::Url, policy: DestinationPolicy) -> Result<(), UrlError> {
    if !matches!(url.scheme(), "http" | "https") {
        return Err(UrlError::NotHttp);
    }
    let refusal = match url.host().ok_or(UrlError::NotHttp)? {
        url::Host::Ipv4(v4) => policy.refusal(IpAddr::V4(v4)),
        url::Host::Ipv6(v6) => policy.refusal(IpAddr::V6(v6)),
        url::Host::Domain(name) => policy.name_refusal(name),
    };
    refusal.map_or(Ok(()), |r| Err(UrlError::Refused(r)))
}

/// A callback URL that passed the guard when it was set. It is parsed the way reqwest parses it
/// (WHATWG), so odd IPv4 spellings (`127.1`, `0x7f000001`, `2130706433`) are judged as the
/// address they name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallbackUrl(url::Url);

impl CallbackUrl {
    /// Parses and checks `text` under `policy`.
    pub fn parse(text: &str, policy: DestinationPolicy) -> Result<Self, UrlError> {
        let url = url::Url::parse(text).map_err(|_| UrlError::NotHttp)?;
        check_url(&url, policy)?;
        Ok(Self(url))
    }

    /// The URL as stored: its WHATWG serialization, which is what reqwest requests.
    pub fn as_str(&self) -> &str {
        self.0.as_str()
    }
}

/// The error a refused destination fails a request with; found again in the error's sources.
#[derive(Debug, thiserror::Error)]
#[error("destination refused: {0}")]
pub struct DestinationRefused(pub Refusal);

impl DestinationRefused {
    /// The guard's refusal, if that is why a request failed (the resolver's error, among the
    /// error's sources).
    pub fn found_in<'e>(err: &'e (dyn std::error::Error + 'static)) -> Option<&'e Self> {
        let mut source = Some(err);
        while let Some(cause) = source {
            if let Some(refused) = cause.downcast_ref::<Self>() {
                return Some(refused);
            }
            source = cause.source();
        }
        None
    }
}

/// A resolver that refuses `localhost` names without resolving, drops refused addresses, and
/// fails when none is left.
pub struct GuardedResolver {
    policy: DestinationPolicy,
}

impl GuardedResolver {
    /// A resolver applying `policy`.
    pub fn new(policy: DestinationPolicy) -> Self {
        Self { policy }
    }
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let host = name.as_str().to_owned();
        let policy = self.policy;
        Box::pin(async move {
            if let Some(refusal) = policy.name_refusal(&host) {
                return Err(DestinationRefused(refusal).into());
            }
            let resolved: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let mut first_refusal = None;
            let allowed: Vec<SocketAddr> = resolved
                .iter()
                .copied()
                .filter(|a| match policy.refusal(a.ip()) {
                    None => true,
                    Some(r) => {
                        first_refusal.get_or_insert(r);
                        false
                    }
                })
                .collect();
            match first_refusal {
                Some(mut refusal) if allowed.is_empty() => {
                    refusal.host = format!("{host} ({})", refusal.host);
                    Err(DestinationRefused(refusal).into())
                }
                _ => Ok(Box::new(allowed.into_iter()) as Addrs),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STRICT: DestinationPolicy = DestinationPolicy {
        allow_private: false,
        allow_link_local: false,
    };
    const PRIVATE: DestinationPolicy = DestinationPolicy {
        allow_private: true,
        allow_link_local: false,
    };
    const EVERYTHING: DestinationPolicy = DestinationPolicy {
        allow_private: true,
        allow_link_local: true,
    };

    fn range(ip: &str) -> Option<Range> {
        classify(ip.parse().unwrap()).map(|r| r.range)
    }

    #[test]
    fn every_internal_range_is_refused_with_its_kind() {
        use Range::*;
        for (ip, expected) in [
            ("127.0.0.1", Private),
            ("127.255.0.9", Private),
            ("10.1.2.3", Private),
            ("172.16.0.1", Private),
            ("172.31.255.255", Private),
            ("192.168.1.1", Private),
            ("100.64.0.1", Private),
            ("100.127.255.254", Private),
            ("169.254.169.254", LinkLocal),
            ("169.254.0.1", LinkLocal),
            ("100.100.100.200", LinkLocal),
            ("0.0.0.0", Reserved),
            ("0.1.2.3", Reserved),
            ("255.255.255.255", Reserved),
            ("224.0.0.1", Reserved),
            ("239.255.255.250", Reserved),
            ("240.0.0.1", Reserved),
            ("192.0.0.8", Reserved),
            ("192.0.0.170", Reserved),
            ("192.0.2.1", Reserved),
            ("198.51.100.7", Reserved),
            ("203.0.113.9", Reserved),
            ("198.18.0.1", Reserved),
            ("198.19.255.1", Reserved),
            ("192.88.99.1", Reserved),
            ("::", Reserved),
            ("::1", Private),
            ("fe80::1", LinkLocal),
            ("febf::1", LinkLocal),
            ("fd00:ec2::254", LinkLocal),
            ("fc00::1", Private),
            ("fd12:3456::1", Private),
            ("fec0::1", Private),
            ("ff02::1", Reserved),
            ("::ffff:127.0.0.1", Private),
            ("::ffff:10.0.0.1", Private),
            ("::ffff:169.254.169.254", LinkLocal),
            ("::ffff:0.0.0.0", Reserved),
            ("::127.0.0.1", Reserved),
            ("::8.8.8.8", Reserved),
            ("64:ff9b::7f00:1", Reserved),
            ("64:ff9b::a9fe:a9fe", Reserved),
            ("64:ff9b::a00:1", Reserved),
            ("64:ff9b:1::808:808", Reserved),
            ("2002:7f00:1::", Reserved),
            ("2002:808:808::", Reserved),
            ("2001::1", Reserved),
            ("2001:0:4136:e378:8000:63bf:3fff:fdd2", Reserved),
            ("2001:db8::1", Reserved),
            ("2001:2::1", Reserved),
            ("2001:10::1", Reserved),
            ("3fff::1", Reserved),
            ("100::1", Reserved),
            ("4000::1", Reserved),
            ("::2:3:4", Reserved),
        ] {
            assert_eq!(range(ip), Some(expected), "{ip}");
        }
    }

    #[test]
    fn public_addresses_pass_including_translations_of_public_ones() {
        for ip in [
            "93.184.216.34",
            "8.8.8.8",
            "1.1.1.1",
            "100.63.255.255",
            "100.128.0.1",
            "172.32.0.1",
            "169.253.0.1",
            "2606:4700::1111",
            "2a00:1450:4001::200e",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2001:4860:4860::8888",
            "2001:200::1",
        ] {
            assert_eq!(range(ip), None, "{ip}");
            assert_eq!(STRICT.refusal(ip.parse().unwrap()), None, "{ip}");
        }
    }

    #[test]
    fn allow_private_never_opens_link_local_or_reserved_ranges() {
        for ip in [
            "127.0.0.1",
            "10.0.0.1",
            "::1",
            "fd00::1",
            "::ffff:127.0.0.1",
        ] {
            let ip = ip.parse().unwrap();
            assert!(STRICT.refusal(ip).is_some());
            assert_eq!(PRIVATE.refusal(ip), None);
        }
        for ip in [
            "169.254.169.254",
            "fe80::1",
            "fd00:ec2::254",
            "::ffff:169.254.1.1",
        ] {
            let ip = ip.parse().unwrap();
            assert!(PRIVATE.refusal(ip).is_some(), "{ip}");
            assert_eq!(EVERYTHING.refusal(ip), None, "{ip}");
        }
        for ip in [
            "0.0.0.0",
            "::",
            "224.0.0.1",
            "64:ff9b::7f00:1",
            "2002:7f00:1::",
        ] {
            assert!(EVERYTHING.refusal(ip.parse().unwrap()).is_some(), "{ip}");
        }
    }

    #[test]
    fn refusals_say_what_the_address_is_and_what_it_embeds() {
        let show = |ip: &str| classify(ip.parse().unwrap()).unwrap().to_string();
        assert_eq!(
            show("169.254.169.254"),
            "169.254.169.254 is a link-local (cloud metadata) address"
        );
        assert_eq!(show("::1"), "::1 is a loopback address");
        assert_eq!(
            show("64:ff9b::7f00:1"),
            "64:ff9b::7f00:1 is a NAT64 address embedding 127.0.0.1, a loopback address"
        );
        assert_eq!(
            show("2002:7f00:1::"),
            "2002:7f00:1:: is a 6to4 address embedding 127.0.0.1, a loopback address"
        );
        assert_eq!(show("2002:808:808::"), "2002:808:808:: is a 6to4 address");
        assert_eq!(
            show("::ffff:a9fe:a9fe"),
            "::ffff:169.254.169.254 is an IPv4-mapped address embedding 169.254.169.254, a \
             link-local (cloud metadata) address"
        );
    }

    #[test]
    fn localhost_names_are_refused_without_resolving_unless_private_is_allowed() {
        for name in ["localhost", "LOCALHOST.", "api.localhost", "a.b.localhost"] {
            assert!(STRICT.name_refusal(name).is_some(), "{name}");
            assert_eq!(PRIVATE.name_refusal(name), None, "{name}");
        }
        for name in ["localhost.example.com", "notlocalhost", "example.com"] {
            assert_eq!(STRICT.name_refusal(name), None, "{name}");
        }
    }

    #[test]
    fn urls_are_judged_as_whatwg_parses_their_host() {
        for url in [
            "http://127.1/",
            "http://0x7f000001/",
            "http://2130706433/",
            "http://017700000001/",
            "http://0177.0.0.1/",
            "http://127.0.0.1./",
            "http://[::ffff:127.0.0.1]/",
            "http://[::1]:8080/",
            "http://0.0.0.0/",
            "http://localhost:9000/",
            "http://169.254.169.254/latest/meta-data",
            "http://[fe80::1]/",
            "http://[64:ff9b::7f00:1]/",
            "http://[64:ff9b::a9fe:a9fe]/",
            "http://[::127.0.0.1]/",
            "http://[2002:7f00:1::]/",
            "http://%31%32%37.0.0.1/",
            "http://hooks.example.com@127.0.0.1/",
            "http://127.0.0.1#@hooks.example.com/",
            "http://[0:0:0:0:0:ffff:7f00:1]/",
        ] {
            assert!(
                matches!(CallbackUrl::parse(url, STRICT), Err(UrlError::Refused(_))),
                "{url}"
            );
        }
        for bad in ["ftp://example.com/", "/relative", "http://", "mailto:a@b.c"] {
            assert_eq!(
                CallbackUrl::parse(bad, EVERYTHING),
                Err(UrlError::NotHttp),
                "{bad}"
            );
        }
        let ok = CallbackUrl::parse("https://hooks.example.com/cb?x=1", STRICT).unwrap();
        assert_eq!(ok.as_str(), "https://hooks.example.com/cb?x=1");
        assert!(CallbackUrl::parse("http://127.0.0.1:9/hook", PRIVATE).is_ok());
    }

    #[test]
    fn the_error_names_the_address_and_the_setting_that_would_allow_it() {
        let err = CallbackUrl::parse("http://169.254.169.254/latest/meta-data", PRIVATE)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("169.254.169.254 is a link-local (cloud metadata) address"),
            "{err}"
        );
        assert!(
            err.contains("VERDICT_ALLOW_LINK_LOCAL_DESTINATIONS"),
            "{err}"
        );
        let err = CallbackUrl::parse("http://127.1/", STRICT)
            .unwrap_err()
            .to_string();
        assert!(err.contains("127.0.0.1 is a loopback address"), "{err}");
    }
}
