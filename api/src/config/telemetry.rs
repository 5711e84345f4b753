//! The telemetry section: how log lines are written. (Traces are configured by the
//! OpenTelemetry variables, which `telemetry.rs` reads itself.)

use clap::Args;

use crate::config::section::{config_section, shown_by_name};
use crate::telemetry::LogFormat;

config_section! {
    /// Logging.
    #[derive(Args, Debug, Clone)]
    pub struct TelemetryConfig {
        /// How log lines are written: `text`, human-readable, or `json`, one object per line
        /// with the trace and span ids (traces go to `OTEL_EXPORTER_OTLP_ENDPOINT` when set).
        #[arg(env = "PAYONCE_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
        pub log_format: LogFormat,
    }
}

shown_by_name!(LogFormat);
