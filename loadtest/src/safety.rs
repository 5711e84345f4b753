//! The load test only ever sends traffic where it is allowed to: loopback, unless told
//! otherwise.
//!
//! Three things keep it there. [`check_targets`] refuses a target that is not a loopback
//! address. The one host name it accepts, `localhost`, must resolve to loopback addresses
//! only — and the client (`client::Api`) does not look it up again: it pins
//! `localhost` to [`LOCALHOST`], so the name cannot lead anywhere else later (a changed
//! hosts file, a resolver that answers otherwise the second time). And the client follows
//! no redirect and uses no proxy, so a target cannot send it elsewhere either.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};

/// Where the client connects for `localhost`, whatever the resolver says: 127.0.0.1 and
/// ::1 (port 0: the URL's port is used).
pub const LOCALHOST: [SocketAddr; 2] = [
    SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0),
    SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), 0),
];

/// Whether an address is a loopback one (`127.0.0.0/8`, `::1`, or `::ffff:127.x.y.z`).
pub fn is_loopback(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(ip) => ip.is_loopback(),
        IpAddr::V6(ip) => ip
            .to_ipv4_mapped()
            .map_or(ip.is_loopback(), |ip| ip.is_loopback()),
    }
}

/// The system's resolver.
fn resolve(name: &str) -> Result<Vec<IpAddr>, String> {
    (name, 0)
        .to_socket_addrs()
        .map(|addresses| addresses.map(|address| address.ip()).collect())
        .map_err(|error| error.to_string())
}

/// Checks every target is an `http(s)` URL on a loopback address (`127.0.0.0/8`, `::1`,
/// or `localhost` when it resolves to loopback addresses only), unless `allow_remote`.
/// Other host names are refused rather than resolved: a name that resolves to loopback
/// today may not tomorrow, and only `localhost` is pinned by the client.
pub fn check_targets(targets: &[String], allow_remote: bool) -> Result<(), String> {
    check_targets_with(targets, allow_remote, resolve)
}

/// [`check_targets`] with the resolver given (the tests plant answers).
pub fn check_targets_with(
    targets: &[String],
    allow_remote: bool,
    resolve: impl Fn(&str) -> Result<Vec<IpAddr>, String>,
) -> Result<(), String> {
    if targets.is_empty() {
        return Err("give at least one target".into());
    }
    for target in targets {
        let url = url::Url::parse(target).map_err(|error| format!("{target}: {error}"))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(format!("{target}: only http and https targets"));
        }
        if allow_remote {
            continue;
        }
        let refused = |why: String| {
            Err(format!(
                "{target} {why}; pass --allow-remote to load-test it"
            ))
        };
        match url.host() {
            Some(url::Host::Ipv4(ip)) if is_loopback(ip.into()) => {}
            Some(url::Host::Ipv6(ip)) if is_loopback(ip.into()) => {}
            Some(url::Host::Domain(name))
                if name.trim_end_matches('.').eq_ignore_ascii_case("localhost") =>
            {
                let addresses = resolve(name)
                    .map_err(|error| format!("{target}: cannot resolve {name}: {error}"))?;
                if let Some(remote) = addresses.iter().find(|ip| !is_loopback(**ip)) {
                    return refused(format!("resolves to {remote}, not a loopback address"));
                }
                if addresses.is_empty() {
                    return refused(format!("{name} resolves to no address"));
                }
            }
            _ => return refused("is not a loopback address".into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn only_loopback_without_permission() {
        let ok = |target: &str| check_targets(&[target.to_owned()], false).is_ok();
        assert!(ok("http://127.0.0.1:8080"));
        assert!(ok("http://127.0.0.2:8080"));
        assert!(ok("http://127.1.2.3"));
        assert!(ok("http://[::1]:8080"));
        assert!(ok("http://[::ffff:127.0.0.1]:8080"));
        assert!(!ok("http://10.0.0.1:8080"));
        assert!(!ok("http://[::2]:8080"));
        assert!(!ok("http://0.0.0.0:8080"));
        assert!(!ok("http://example.com"));
        assert!(!ok("http://payonce-1:8080"));
        assert!(!ok("ftp://127.0.0.1"));
        assert!(!ok("not a url"));
        assert!(check_targets(&["http://payonce-1:8080".to_owned()], true).is_ok());
        assert!(check_targets(&[], true).is_err());
    }

    /// `localhost` is not trusted by its name: it must resolve to loopback addresses only.
    #[test]
    fn localhost_must_resolve_to_loopback_only() {
        let check = |addresses: Vec<IpAddr>| {
            check_targets_with(&["http://localhost:8080/".to_owned()], false, move |_| {
                Ok(addresses.clone())
            })
        };
        assert!(check(vec![ip("127.0.0.1"), ip("::1")]).is_ok());
        assert!(check(vec![ip("127.0.0.2")]).is_ok());
        let refused = check(vec![ip("10.0.0.7")]).unwrap_err();
        assert!(refused.contains("10.0.0.7"), "{refused}");
        assert!(check(vec![ip("127.0.0.1"), ip("192.168.1.2")]).is_err());
        assert!(check(vec![]).is_err());
        assert!(
            check_targets_with(&["http://localhost".to_owned()], false, |_| Err(
                "no resolver".into()
            ))
            .is_err()
        );
        // With permission, nothing is resolved.
        assert!(
            check_targets_with(&["http://localhost".to_owned()], true, |_| Ok(vec![ip(
                "10.0.0.7"
            )]))
            .is_ok()
        );
        // Only `localhost` is resolved; other names are refused, whatever they resolve to.
        assert!(
            check_targets_with(&["http://db.internal".to_owned()], false, |_| Ok(vec![ip(
                "127.0.0.1"
            )]))
            .is_err()
        );
        // This machine's own `localhost` is loopback.
        assert!(check_targets(&["http://localhost:8080".to_owned()], false).is_ok());
    }

    #[test]
    fn the_client_pins_localhost_to_loopback() {
        assert!(LOCALHOST.iter().all(|address| is_loopback(address.ip())));
    }
}
