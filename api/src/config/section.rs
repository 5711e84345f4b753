//! What every section of the configuration shares: the error a check returns, the value
//! parsers, secrets, URL masking, and how a section's values reach the start-up report.
//!
//! A section is declared with [`config_section!`]: a clap `Args` struct whose every field
//! shows in the report under its argument's environment variable — adding a setting is
//! adding a field (and its row in docs/configuration.md), nothing else. This module
//! imports no subsystem, so each subsystem can keep its section beside it without an
//! import cycle through `config`.

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use ipnet::IpNet;

/// Settings that cannot work together.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A database without a lock service, or the reverse.
    #[error(
        "{set} is set but {unset} is not: the distributed mode needs both, the embedded mode neither"
    )]
    HalfDistributed {
        /// The one that is set.
        set: &'static str,
        /// The one that is missing.
        unset: &'static str,
    },
    /// A setting out of range.
    #[error("{0}")]
    Invalid(String),
}

/// `10s`, `1500ms`, `7days`: a duration as people write it.
pub(crate) fn duration(text: &str) -> Result<Duration, humantime::DurationError> {
    humantime::parse_duration(text)
}

/// A CIDR block (`10.0.0.0/8`, `fd00::/8`) or one address (`10.0.0.7`: a block of one).
pub(crate) fn network(text: &str) -> Result<IpNet, String> {
    let text = text.trim();
    text.parse::<IpNet>()
        .or_else(|_| text.parse::<IpAddr>().map(IpNet::from))
        .map(|network| network.trunc())
        .map_err(|_| format!("{text:?} is neither a CIDR block (10.0.0.0/8) nor an address"))
}

/// A setting that is a secret: shown as `****` wherever the configuration is printed or
/// debugged.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// The secret itself, for the one place that needs it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for Secret {
    type Err = std::convert::Infallible;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Ok(Self(text.to_owned()))
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(****)")
    }
}

/// A URL with its secrets replaced, for printing: the password in the authority, and
/// query parameters that carry one (`?password=…`, which PostgreSQL URLs accept, and
/// anything else that looks like a secret).
pub fn mask(url: &str) -> String {
    let secret = |name: &str| {
        let name = name.to_ascii_lowercase();
        ["password", "passwd", "secret", "token", "key"]
            .iter()
            .any(|word| name.contains(word))
    };
    let Ok(mut parsed) = url::Url::parse(url) else {
        // A URL naming several hosts (`zk://a:2181,b:2181/root`) is not one `url` can
        // parse; shown as it is unless it could carry a password (in its authority or a
        // query parameter).
        let query = url.split_once('?').map_or("", |(_, query)| query);
        let named_secret = query
            .split('&')
            .any(|pair| secret(pair.split('=').next().unwrap_or(pair)));
        if !url.contains('@') && !named_secret {
            return url.to_owned();
        }
        return "<unparseable URL>".to_owned();
    };
    if parsed.password().is_some() {
        // Only fails for URLs that cannot have a password, which this one has.
        let _ = parsed.set_password(Some("****"));
    }
    if parsed.query().is_some() {
        let pairs: Vec<(String, String)> = parsed
            .query_pairs()
            .map(|(name, value)| {
                let value = if secret(&name) {
                    "****".to_owned()
                } else {
                    value.into_owned()
                };
                (name.into_owned(), value)
            })
            .collect();
        parsed.query_pairs_mut().clear().extend_pairs(pairs);
    }
    parsed.to_string()
}

/// One setting as a section reports it: its argument's id (the field's name) and its
/// value, before the report masks it.
#[derive(Debug, Clone)]
pub struct Row {
    /// The clap argument's id: the field's name.
    pub id: &'static str,
    /// The value's items (one, or a list's), or `None` when unset.
    pub value: Option<Vec<String>>,
    /// What the report shows when unset, where the section says more than `(unset)`.
    pub unset: Option<&'static str>,
}

/// A section, or one setting's value: adds its rows to the report.
pub trait Report {
    /// Adds the rows: one for a setting (under `id`), every field's for a section.
    fn report(&self, id: &'static str, rows: &mut Vec<Row>);
}

/// How one value shows: its items, or `None` when unset.
pub trait Shown {
    /// The value's items.
    fn shown(&self) -> Option<Vec<String>>;
}

impl Shown for Duration {
    fn shown(&self) -> Option<Vec<String>> {
        Some(vec![humantime::format_duration(*self).to_string()])
    }
}

impl Shown for PathBuf {
    fn shown(&self) -> Option<Vec<String>> {
        Some(vec![self.display().to_string()])
    }
}

impl Shown for Secret {
    fn shown(&self) -> Option<Vec<String>> {
        Some(vec!["****".to_owned()])
    }
}

impl<T: Shown> Shown for Option<T> {
    fn shown(&self) -> Option<Vec<String>> {
        self.as_ref().and_then(Shown::shown)
    }
}

/// An empty list is an unset setting (clap gives one for a variable not set).
impl<T: Shown> Shown for Vec<T> {
    fn shown(&self) -> Option<Vec<String>> {
        let items: Vec<String> = self.iter().filter_map(Shown::shown).flatten().collect();
        (!items.is_empty()).then_some(items)
    }
}

/// Values shown as they display.
macro_rules! shown_as_displayed {
    ($($type:ty),* $(,)?) => {$(
        impl Shown for $type {
            fn shown(&self) -> Option<Vec<String>> {
                Some(vec![self.to_string()])
            }
        }
    )*};
}
shown_as_displayed!(String, SocketAddr, IpNet, bool, u32, usize);

/// `clap::ValueEnum` types, shown by the name the command line takes.
macro_rules! shown_by_name {
    ($($type:ty),* $(,)?) => {$(
        impl $crate::config::section::Shown for $type {
            fn shown(&self) -> Option<Vec<String>> {
                clap::ValueEnum::to_possible_value(self).map(|value| vec![value.get_name().to_owned()])
            }
        }
    )*};
}
pub(crate) use shown_by_name;

impl<T: Shown> Report for T {
    fn report(&self, id: &'static str, rows: &mut Vec<Row>) {
        rows.push(Row {
            id,
            value: self.shown(),
            unset: None,
        });
    }
}

/// Declares a section of the configuration: a clap `Args` struct (its attributes and
/// fields as written) that reports every field's value under the field's name — the
/// argument's id — so the start-up report needs no row written for it. Every field is a
/// global `--flag` (the macro says `long, global = true` for all of them, so a field's own
/// `#[arg(…)]` names only its variable and value). An optional `sections { field: Type }`
/// flattens other sections in after the fields, reported row by row as their own; an
/// optional `unset { field => "text" }` says what an unset field means, where `(unset)`
/// would not.
macro_rules! config_section {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $(
                $(#[$field_meta:meta])*
                $field_vis:vis $field:ident : $type:ty
            ),* $(,)?
        }
        $(sections { $(
            $(#[$section_meta:meta])*
            $section_vis:vis $section:ident : $section_type:ty
        ),* $(,)? })?
        $(unset { $($unset_field:ident => $unset_text:literal),* $(,)? })?
    ) => {
        $(#[$meta])*
        $vis struct $name {
            $(
                #[arg(long, global = true)]
                $(#[$field_meta])*
                $field_vis $field: $type,
            )*
            $($(
                #[command(flatten)]
                $(#[$section_meta])*
                $section_vis $section: $section_type,
            )*)?
        }

        impl $name {
            /// What the report shows for these fields when unset.
            const UNSET_SHOWN: &'static [(&'static str, &'static str)] =
                &[$($((stringify!($unset_field), $unset_text)),*)?];
        }

        impl $crate::config::section::Report for $name {
            fn report(&self, _id: &'static str, rows: &mut Vec<$crate::config::section::Row>) {
                // Every name in `unset` is a field.
                $($(let _ = &self.$unset_field;)*)?
                let first = rows.len();
                $(
                    $crate::config::section::Report::report(&self.$field, stringify!($field), rows);
                )*
                $($(
                    $crate::config::section::Report::report(&self.$section, stringify!($section), rows);
                )*)?
                for row in &mut rows[first..] {
                    if let Some((_, text)) = Self::UNSET_SHOWN.iter().find(|(id, _)| *id == row.id) {
                        row.unset = Some(text);
                    }
                }
            }
        }
    };
}
pub(crate) use config_section;
