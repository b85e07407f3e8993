//! `redrive serve`: load the configuration, set up logging, run the server.
//!
//! Exit codes: 0 after a graceful shutdown (SIGTERM / SIGINT); 2 when the
//! configuration is refused (bad key or value, a public address without a
//! token) or the data directory is in use by another redrive (its lock is held);
//! 1 when the server cannot start otherwise (store, bind) or fails.
//!
//! Logs go to stdout, coloured only when stdout is a terminal and `NO_COLOR` is not
//! set (<https://no-color.org>): a journal, a pipe or a file gets plain text.

use crate::ServeArgs;
use redrive_server::{Config, Overrides, ServerError};
use redrive_storage::StoreError;
use std::io::IsTerminal;
use std::process::ExitCode;
use tracing_subscriber::EnvFilter;

/// Run the server until SIGTERM/SIGINT (see the module doc for exit codes).
pub fn run(args: &ServeArgs) -> ExitCode {
    let overrides = Overrides {
        listen: args.listen.clone(),
        data_dir: args.data_dir.clone(),
        storage_url: args.storage_url.clone(),
    };
    // REDRIVE_SERVER / REDRIVE_TOKEN (the client commands') are skipped by Config::load.
    let config = match Config::load(args.config.as_deref(), std::env::vars(), &overrides) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    if let Err(message) = init_logging(&config.log) {
        eprintln!("error: {message}");
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(redrive_server::serve(config)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            match e {
                // Refused at start because of what the operator configured, or because
                // another server has the data directory: starting again will not help.
                ServerError::Config(_)
                | ServerError::PublicWithoutToken(_)
                | ServerError::Store {
                    source: StoreError::DataDirLocked { .. },
                    ..
                } => ExitCode::from(2),
                _ => {
                    tracing::error!(error = %e, "server stopped with an error");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

/// Install the `tracing` subscriber: `RUST_LOG` when set, else the config's `log`.
fn init_logging(config_log: &str) -> Result<(), String> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(v) if !v.trim().is_empty() => EnvFilter::try_new(&v)
            .map_err(|e| format!("RUST_LOG: not a valid log filter {v:?}: {e}"))?,
        _ => log_filter(config_log)?,
    };
    let ansi = colour(
        std::io::stdout().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    );
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stdout)
        .with_ansi(ansi)
        .init();
    Ok(())
}

/// Whether log lines may carry colour escapes: only on a terminal, and not when `NO_COLOR`
/// is set to anything but the empty string (<https://no-color.org>).
fn colour(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

/// The config key `log` as a filter, naming the key when it is not one.
fn log_filter(log: &str) -> Result<EnvFilter, String> {
    EnvFilter::try_new(log)
        .map_err(|e| format!("config key log: not a valid log filter {log:?}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_filter_names_the_key() {
        assert!(log_filter("info").is_ok());
        assert!(log_filter("redrive=debug,tower=warn").is_ok());
        let e = log_filter("redrive=loud").unwrap_err();
        assert!(e.starts_with("config key log"), "{e}");
    }

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        use std::ffi::OsStr;
        assert!(colour(true, None));
        assert!(
            colour(true, Some(OsStr::new(""))),
            "an empty NO_COLOR is unset"
        );
        assert!(!colour(true, Some(OsStr::new("1"))));
        assert!(!colour(false, None));
    }
}
