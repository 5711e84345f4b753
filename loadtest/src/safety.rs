//! The load test only ever sends traffic where it is allowed to: loopback, unless told
//! otherwise.

/// Checks every target is an `http(s)` URL on a loopback address (`localhost`,
/// `127.0.0.0/8`, `::1`), unless `allow_remote`. Host names other than `localhost` are
/// refused rather than resolved: a name that resolves to loopback today may not tomorrow.
pub fn check_targets(targets: &[String], allow_remote: bool) -> Result<(), String> {
    if targets.is_empty() {
        return Err("give at least one target".into());
    }
    for target in targets {
        let url = url::Url::parse(target).map_err(|error| format!("{target}: {error}"))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(format!("{target}: only http and https targets"));
        }
        let loopback = match url.host() {
            Some(url::Host::Domain(name)) => name.eq_ignore_ascii_case("localhost"),
            Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
            Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
            None => false,
        };
        if !loopback && !allow_remote {
            return Err(format!(
                "{target} is not a loopback address; pass --allow-remote to load-test it"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_without_permission() {
        let ok = |target: &str| check_targets(&[target.to_owned()], false).is_ok();
        assert!(ok("http://127.0.0.1:8080"));
        assert!(ok("http://127.1.2.3"));
        assert!(ok("http://localhost:8080/"));
        assert!(ok("http://[::1]:8080"));
        assert!(!ok("http://10.0.0.1:8080"));
        assert!(!ok("http://example.com"));
        assert!(!ok("http://payonce-1:8080"));
        assert!(!ok("ftp://127.0.0.1"));
        assert!(!ok("not a url"));
        assert!(check_targets(&["http://payonce-1:8080".to_owned()], true).is_ok());
        assert!(check_targets(&[], true).is_err());
    }
}
