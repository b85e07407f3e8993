//! `redrive serve`: load the configuration, set up logging, run the server.
//!
//! Exit codes: 0 after a graceful shutdown (SIGTERM / SIGINT); 2 when the
//! configuration is refused (bad key or value, a public address without a
//! token); 1 when the server cannot start (store, bind) or fails.

use crate::ServeArgs;
use redrive_server::{Config, Overrides, ServerError};
use std::process::ExitCode;
use tracing_subscriber::EnvFilter;

/// Run the server until SIGTERM/SIGINT (see the module doc for exit codes).
pub fn run(args: &ServeArgs) -> ExitCode {
    let overrides = Overrides {
        listen: args.listen.clone(),
        data_dir: args.data_dir.clone(),
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
                // Refused at start because of what the operator configured.
                ServerError::Config(_) | ServerError::PublicWithoutToken(_) => ExitCode::from(2),
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
    tracing_subscriber::fmt().with_env_filter(filter).init();
    Ok(())
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
}
