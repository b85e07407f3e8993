//! The server's HTTP application: the one place that composes the routers (the API's `/v1`
//! and operations routes from `api`, the console from `ui`) with the state they share
//! ([`AppState`]: the engine, metrics, configuration, tokens and the console's sessions),
//! and puts the layers every route passes through around them: the body limit, the
//! browser guard (`api/browser.rs`) and JSON error bodies. `api` does not know the console,
//! and the console uses the API's handlers and types but mounts itself here.

use crate::api::{self, auth};
use crate::engine::Engine;
use crate::metrics::Metrics;
use crate::Config;
use axum::extract::Request;
use axum::middleware::Next;
use std::sync::Arc;

/// What every handler, API or console, gets.
#[derive(Clone, Debug)]
pub struct AppState {
    /// The engine.
    pub engine: Arc<Engine>,
    /// The metrics.
    pub metrics: Arc<Metrics>,
    /// The server's configuration (limits, tokens).
    pub config: Arc<Config>,
    /// The tokens that may call, with their scopes.
    pub tokens: Arc<auth::Tokens>,
    /// The console's signed-in sessions (`ui/session.rs`; kept in the store, so every node
    /// knows them).
    pub sessions: Arc<crate::ui::Sessions>,
}

/// The whole HTTP application.
pub fn router(engine: Arc<Engine>, metrics: Arc<Metrics>, config: Arc<Config>) -> axum::Router {
    let max_body = config.max_request_bytes;
    let state = AppState {
        sessions: Arc::new(crate::ui::Sessions::new(engine.store().clone())),
        engine,
        metrics,
        tokens: Arc::new(auth::Tokens::from_config(&config)),
        config,
    };
    let browser = Arc::new(api::BrowserGuard::new(
        state.config.listens_on_loopback(),
        &state.config.allowed_hosts,
        &state.config.allowed_origins,
    ));
    let (v1, ops) = api::routes(&state);
    axum::Router::new()
        .merge(v1)
        .merge(ops)
        .merge(crate::ui::router(state.clone()))
        .fallback(api::not_found)
        .method_not_allowed_fallback(api::method_not_allowed)
        .layer(axum::extract::DefaultBodyLimit::max(max_body))
        .layer(axum::middleware::from_fn(
            move |req: Request, next: Next| api::browser::guard(browser.clone(), req, next),
        ))
        .layer(axum::middleware::map_response(api::json_errors))
        .with_state(state)
}
