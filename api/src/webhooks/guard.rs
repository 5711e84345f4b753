//! The SSRF guard: a webhook URL is chosen by a client, and payonce connects to it from
//! inside the network it runs in. An address is refused if it is loopback, private
//! (RFC 1918, IPv6 unique-local, NAT64's local-use prefix), link-local, shared
//! (carrier-grade NAT), unspecified, multicast, broadcast or reserved — an IPv4 address
//! written in IPv6 (mapped, IPv4-compatible, behind NAT64) judged as IPv4 — unless
//! `PAYONCE_WEBHOOK_ALLOW_PRIVATE` is set, for tests and trying payonce out on one
//! machine. Cloud metadata addresses, in any of those forms, are refused even then.
//!
//! A host name is resolved once per connection by [`GuardedResolver`], which hands
//! reqwest only the addresses it checked: the connection goes to an address that passed,
//! so a name that resolves one way when checked and another when connected (DNS
//! rebinding) gains nothing. A URL whose host is an address is checked by [`Guard::url`],
//! since reqwest does not resolve those.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

/// Cloud metadata services, refused always.
const METADATA: [IpAddr; 2] = [
    IpAddr::V4(Ipv4Addr::new(169, 254, 169, 254)),
    IpAddr::V6(Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)),
];

/// The IPv4 address an IPv6 address is a way of writing, if it is one: IPv4-mapped
/// (`::ffff:a.b.c.d`), IPv4-compatible (`::a.b.c.d`: deprecated, still routed by some
/// stacks), or behind NAT64's well-known prefix (`64:ff9b::/96`) or its local-use prefix
/// (`64:ff9b:1::/48`, RFC 8215: read from the last 32 bits, where a /96 puts them). `::`
/// and `::1` are IPv6's own unspecified and loopback addresses.
fn carried_v4(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let segments = v6.segments();
    let last32 = || {
        let [a, b] = segments[6].to_be_bytes();
        let [c, d] = segments[7].to_be_bytes();
        Ipv4Addr::new(a, b, c, d)
    };
    if let Some(v4) = v6.to_ipv4_mapped() {
        Some(v4)
    } else if segments[..6] == [0; 6] {
        (!v6.is_unspecified() && !v6.is_loopback()).then(last32)
    } else if segments[..6] == [0x64, 0xff9b, 0, 0, 0, 0] || is_local_nat64(v6) {
        Some(last32())
    } else {
        None
    }
}

/// Whether `v6` is in NAT64's local-use prefix, `64:ff9b:1::/48`: a translator inside
/// some network to IPv4 addresses of that network's choosing — internal whatever it
/// carries.
fn is_local_nat64(v6: Ipv6Addr) -> bool {
    v6.segments()[..3] == [0x64, 0xff9b, 1]
}

/// Why an address is refused, if it is: the kind of address it is.
pub fn internal(address: IpAddr) -> Option<&'static str> {
    match address {
        IpAddr::V4(v4) => internal_v4(v4),
        IpAddr::V6(v6) => {
            if is_local_nat64(v6) {
                return Some("local-use NAT64");
            }
            if let Some(v4) = carried_v4(v6) {
                return internal_v4(v4);
            }
            let first = v6.segments()[0];
            if v6.is_loopback() {
                Some("loopback")
            } else if v6.is_unspecified() {
                Some("unspecified")
            } else if v6.is_multicast() {
                Some("multicast")
            } else if first & 0xfe00 == 0xfc00 {
                Some("private (unique-local)")
            } else if first & 0xffc0 == 0xfe80 {
                Some("link-local")
            } else if first == 0x2001 && v6.segments()[1] == 0x0db8 {
                Some("documentation")
            } else {
                None
            }
        }
    }
}

/// Whether `address` is a cloud metadata address, written in IPv4 or in any IPv6 form
/// of one.
fn is_metadata(address: IpAddr) -> bool {
    let carried = match address {
        IpAddr::V6(v6) => carried_v4(v6).map(IpAddr::V4),
        IpAddr::V4(_) => None,
    };
    METADATA.contains(&address) || carried.is_some_and(|v4| METADATA.contains(&v4))
}

fn internal_v4(v4: Ipv4Addr) -> Option<&'static str> {
    let [a, b, ..] = v4.octets();
    if v4.is_loopback() {
        Some("loopback")
    } else if v4.is_private() {
        Some("private")
    } else if v4.is_link_local() {
        Some("link-local")
    } else if v4.is_unspecified() || a == 0 {
        Some("unspecified")
    } else if v4.is_broadcast() {
        Some("broadcast")
    } else if v4.is_multicast() {
        Some("multicast")
    } else if a == 100 && (64..128).contains(&b) {
        Some("shared (carrier-grade NAT)")
    } else if a >= 240 {
        Some("reserved")
    } else if v4.is_documentation() || (a == 198 && (b == 18 || b == 19)) {
        Some("documentation or benchmarking")
    } else {
        None
    }
}

/// Which addresses webhooks may go to.
#[derive(Clone, Debug, Default)]
pub struct Guard {
    /// Loopback, private and link-local addresses too (metadata addresses never).
    pub allow_private: bool,
    /// When not empty, only addresses in these networks (an egress allow-list; the fuzzer
    /// sets loopback, so nothing it makes up is ever contacted).
    pub only: Arc<[ipnet::IpNet]>,
    /// The demonstration inbox's address (the embedded mode's; payonce chose it): a URL
    /// naming exactly this address and port passes.
    pub inbox: Option<SocketAddr>,
}

impl Guard {
    /// Whether deliveries may go to `address`; if not, why.
    pub fn check(&self, address: IpAddr) -> Result<(), String> {
        let canonical = address.to_canonical();
        if is_metadata(address) {
            return Err(format!("{address} is a cloud metadata address"));
        }
        if !self.only.is_empty() && !self.only.iter().any(|net| net.contains(&canonical)) {
            return Err(format!(
                "{address} is outside PAYONCE_WEBHOOK_ALLOWED_NETWORKS"
            ));
        }
        match internal(canonical) {
            Some(kind) if !self.allow_private => Err(format!(
                "{address} is a {kind} address (PAYONCE_WEBHOOK_ALLOW_PRIVATE allows it)"
            )),
            _ => Ok(()),
        }
    }

    /// A webhook URL as payonce takes it: `http` or `https`, a host, no user name or
    /// password, no fragment; a host that is an address passes [`check`](Self::check).
    pub fn url(&self, text: &str) -> Result<url::Url, String> {
        if !shaped_like_a_url(text) {
            return Err(
                "not an http(s) URL without credentials, fragment or white space".to_owned(),
            );
        }
        let url = url::Url::parse(text).map_err(|error| format!("not a URL: {error}"))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(format!(
                "the scheme must be http or https, not {}",
                url.scheme()
            ));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err("a webhook URL carries no user name or password".to_owned());
        }
        if url.fragment().is_some() {
            return Err("a webhook URL has no fragment".to_owned());
        }
        let literal = match url.host() {
            None => return Err("a webhook URL needs a host".to_owned()),
            Some(url::Host::Ipv4(v4)) => Some(IpAddr::V4(v4)),
            Some(url::Host::Ipv6(v6)) => Some(IpAddr::V6(v6)),
            Some(url::Host::Domain(_)) => None,
        };
        if let Some(address) = literal {
            let port = url.port_or_known_default().unwrap_or(0);
            if self.inbox != Some(SocketAddr::new(address, port)) {
                self.check(address)?;
            }
        }
        Ok(url)
    }

    /// Resolves `url`'s host once and refuses it if every address it has is refused —
    /// what a client registering an endpoint is told at once. A name that does not
    /// resolve now passes (deliveries will say); the check that counts is the one made
    /// when connecting ([`GuardedResolver`]).
    pub async fn resolves_somewhere_allowed(&self, url: &url::Url) -> Result<(), String> {
        let Some(url::Host::Domain(host)) = url.host() else {
            return Ok(());
        };
        let port = url.port_or_known_default().unwrap_or(443);
        let lookup = tokio::time::timeout(
            std::time::Duration::from_secs(2),
            tokio::net::lookup_host((host, port)),
        )
        .await;
        let Ok(Ok(addresses)) = lookup else {
            return Ok(());
        };
        let addresses: Vec<SocketAddr> = addresses.collect();
        let refusals: Vec<String> = addresses
            .iter()
            .filter_map(|address| self.check(address.ip()).err())
            .collect();
        if !addresses.is_empty() && refusals.len() == addresses.len() {
            return Err(format!(
                "{host} resolves to refused addresses: {}",
                refusals.join("; ")
            ));
        }
        Ok(())
    }
}

/// What the OpenAPI document's pattern for a webhook URL states,
/// `^[Hh][Tt][Tt][Pp][Ss]?://[^@/?#\s]+([/?][^#\s]*)?$`: the scheme, an authority without
/// `@`, then a path or query; no fragment and no white space anywhere. Checked before the
/// URL is parsed, so the server takes nothing the document calls invalid (the URL parser
/// alone would take, say, a space it can percent-encode).
fn shaped_like_a_url(text: &str) -> bool {
    let lower = text.get(..8).unwrap_or(text).to_ascii_lowercase();
    let rest = if lower.starts_with("https://") {
        &text[8..]
    } else if lower.starts_with("http://") {
        &text[7..]
    } else {
        return false;
    };
    // ECMAScript's \s is Unicode white space and U+FEFF.
    let blank = |c: char| c.is_whitespace() || c == '\u{feff}';
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(authority_end);
    !authority.is_empty()
        && !authority.contains(['@', '#'])
        && !authority.chars().any(blank)
        && !tail.contains('#')
        && !tail.chars().any(blank)
}

/// reqwest's resolver for webhook deliveries: the system's resolution, less every address
/// the guard refuses.
#[derive(Debug)]
pub struct GuardedResolver {
    guard: Guard,
}

impl GuardedResolver {
    /// The resolver, for [`reqwest::ClientBuilder::dns_resolver`].
    pub fn new(guard: Guard) -> Arc<Self> {
        Arc::new(Self { guard })
    }
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let guard = self.guard.clone();
        Box::pin(async move {
            let host = name.as_str().to_owned();
            let resolved: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let mut refusals = Vec::new();
            let allowed: Vec<SocketAddr> = resolved
                .into_iter()
                .filter(|address| match guard.check(address.ip()) {
                    Ok(()) => true,
                    Err(why) => {
                        refusals.push(why);
                        false
                    }
                })
                .collect();
            if allowed.is_empty() {
                let why = if refusals.is_empty() {
                    format!("{host} has no address")
                } else {
                    format!("{host} refused: {}", refusals.join("; "))
                };
                return Err(why.into());
            }
            let addresses: Addrs = Box::new(allowed.into_iter());
            Ok(addresses)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn internal_addresses_are_refused_and_public_ones_pass() {
        let strict = Guard::default();
        for refused in [
            "127.0.0.1",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "169.254.1.1",
            "100.64.0.1",
            "0.0.0.0",
            "255.255.255.255",
            "224.0.0.1",
            "240.0.0.1",
            "::1",
            "::",
            "fc00::1",
            "fd00:ec2::254",
            "fe80::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "64:ff9b::a00:1",
            "64:ff9b:1::a00:1",
            "64:ff9b:1::808:808",
            "::7f00:1",
            "::a00:1",
            "::a9fe:a9fe",
            "ff02::1",
        ] {
            assert!(strict.check(ip(refused)).is_err(), "{refused}");
        }
        for allowed in [
            "93.184.216.34",
            "8.8.8.8",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
        ] {
            assert_eq!(strict.check(ip(allowed)), Ok(()), "{allowed}");
        }
    }

    #[test]
    fn allowing_private_addresses_never_allows_metadata() {
        let lenient = Guard {
            allow_private: true,
            ..Guard::default()
        };
        assert_eq!(lenient.check(ip("127.0.0.1")), Ok(()));
        assert_eq!(lenient.check(ip("10.0.0.1")), Ok(()));
        assert!(lenient.check(ip("169.254.169.254")).is_err());
        assert!(lenient.check(ip("::ffff:169.254.169.254")).is_err());
        assert!(lenient.check(ip("fd00:ec2::254")).is_err());
        // NAT64 (well-known and local-use) and IPv4-compatible forms of it, too.
        for metadata in ["64:ff9b::a9fe:a9fe", "64:ff9b:1::a9fe:a9fe", "::a9fe:a9fe"] {
            assert!(lenient.check(ip(metadata)).is_err(), "{metadata}");
        }
        assert_eq!(lenient.check(ip("64:ff9b:1::a00:1")), Ok(()));
    }

    #[test]
    fn the_inbox_alone_passes_on_loopback() {
        let guard = Guard {
            inbox: Some("127.0.0.1:4567".parse().unwrap()),
            ..Guard::default()
        };
        assert!(guard.url("http://127.0.0.1:4567/inbox/a").is_ok());
        assert!(guard.url("http://127.0.0.1:4568/inbox/a").is_err());
        assert!(guard.url("http://127.0.0.2:4567/").is_err());
    }

    #[test]
    fn an_allow_list_admits_only_its_networks() {
        let loopback_only = Guard {
            allow_private: true,
            only: vec!["127.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()].into(),
            ..Guard::default()
        };
        assert_eq!(loopback_only.check(ip("127.0.0.2")), Ok(()));
        assert_eq!(loopback_only.check(ip("::1")), Ok(()));
        assert!(loopback_only.check(ip("8.8.8.8")).is_err());
        assert!(loopback_only.check(ip("10.0.0.1")).is_err());
    }

    #[test]
    fn the_documents_url_pattern_is_what_is_checked() {
        for shaped in [
            "http://a",
            "HTTPS://example.com/x?y=1",
            "http://h:80?q",
            "https://h/p@q",
        ] {
            assert!(shaped_like_a_url(shaped), "{shaped}");
        }
        for unshaped in [
            "",
            "http://",
            "ftp://a",
            "http:/a",
            "http://u@h/",
            "http://h/#f",
            "http://h/ a",
            "http://h\u{feff}/",
            "http:// h",
            "http://#h",
        ] {
            assert!(!shaped_like_a_url(unshaped), "{unshaped:?}");
        }
    }

    #[test]
    fn urls_must_be_plain_http_to_an_allowed_host() {
        let strict = Guard::default();
        assert!(strict.url("https://hooks.example.com/payonce").is_ok());
        for bad in [
            "ftp://example.com/",
            "https://user:pw@example.com/",
            "https://example.com/#frag",
            "http://127.0.0.1:8080/",
            "http://[::1]/",
            "http://169.254.169.254/latest/meta-data",
            "http://2130706433/",
            "not a url",
        ] {
            assert!(strict.url(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn a_name_that_resolves_only_to_refused_addresses_is_refused() {
        let strict = Guard::default();
        let url = strict.url("http://localhost:9/").unwrap();
        assert!(strict.resolves_somewhere_allowed(&url).await.is_err());
        let resolver = GuardedResolver::new(strict);
        let name: Name = "localhost".parse().unwrap();
        assert!(resolver.resolve(name).await.is_err());
        let lenient = GuardedResolver::new(Guard {
            allow_private: true,
            ..Guard::default()
        });
        let name: Name = "localhost".parse().unwrap();
        let addresses: Vec<_> = lenient.resolve(name).await.unwrap().collect();
        assert!(addresses.iter().all(|a| a.ip().is_loopback()) && !addresses.is_empty());
    }
}
