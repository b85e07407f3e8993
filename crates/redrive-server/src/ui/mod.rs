//! The operator console at `/ui` (SPEC §12): server-rendered HTML pages over the same
//! engine and store calls as the API, served by the same binary, with no script and no
//! front-end build.
//!
//! One file per page or group of pages: [`overview`] (queues and charts), [`queues`]
//! (one queue: counts, policy, settings, endpoint or bridge), [`messages`] (search,
//! export, one message and its actions), [`groups`] (failure groups), [`tasks`] (bulk
//! tasks: confirm, create, progress, pause / resume / cancel), [`audit`], [`delivery`]
//! (push endpoints and bridges), [`login`]. [`session`] holds the sign-in, the session
//! cookie and the checks every request passes (CSRF, Origin, scope); [`html`] the
//! escaping every page relies on; [`charts`] the inline SVG.
//!
//! What it may use: the engine and the store (through `AppState`), the API's data
//! functions (`api::queues::list`, `api::groups::collect`, `api::endpoints::views`,
//! `api::tasks::create` / `transition`, `api::messages::export`, `filter_of`,
//! `act`), so a page shows what the API answers and an action through a page is
//! the API's action, audited with the same names and the session's token name. Nothing
//! in the engine or the API knows about the console (except the browser guard, which
//! lets its form posts through the JSON-only check, and `json_errors`, which leaves its
//! HTML error pages alone).

pub mod audit;
pub mod charts;
pub mod delivery;
pub mod groups;
pub mod html;
pub mod login;
pub mod messages;
pub mod overview;
pub mod queues;
pub mod session;
pub mod tasks;

pub use session::{Sessions, Ui};

use crate::api::{ApiError, AppState};
use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

/// The console's stylesheet, served from the binary.
const CSS: &str = include_str!("console.css");

/// Every `/ui` route, behind [`session::gate`].
pub fn router(state: AppState) -> Router<AppState> {
    Router::new()
        .route("/ui", get(overview::page))
        .route("/ui/queues/{queue}", get(queues::page))
        .route("/ui/messages", get(messages::search))
        .route("/ui/messages/export", get(messages::export))
        .route("/ui/messages/{id}", get(messages::detail))
        .route("/ui/messages/{id}/redrive", post(messages::redrive))
        .route("/ui/messages/{id}/edit", post(messages::edit))
        .route("/ui/messages/{id}/kill", post(messages::kill))
        .route("/ui/messages/{id}/delete", post(messages::delete))
        .route("/ui/groups", get(groups::page))
        .route("/ui/tasks", get(tasks::list).post(tasks::create))
        .route("/ui/tasks/new", get(tasks::confirm))
        .route("/ui/tasks/{id}", get(tasks::detail))
        .route("/ui/tasks/{id}/{verb}", post(tasks::transition))
        .route("/ui/audit", get(audit::page))
        .route("/ui/endpoints", get(delivery::endpoints))
        .route("/ui/bridges", get(delivery::bridges))
        .route("/ui/login", get(login::form).post(login::sign_in))
        .route("/ui/logout", post(login::sign_out))
        .route("/ui/static/console.css", get(css))
        .route("/ui/static/{*rest}", get(no_such_file))
        .route("/ui/", get(|| async { session::see_other("/ui") }))
        .route("/ui/{*rest}", get(not_found))
        .layer(axum::middleware::from_fn(
            move |req: Request, next: Next| session::gate(state.clone(), req, next),
        ))
}

/// Any other `GET /ui/…`: a 404 page (after the gate: only a signed-in caller sees it).
/// The gate lets a few paths through without a [`Ui`] (the stylesheet, sign-in); should
/// one of them reach here, it is still a 404, never a 500 naming a missing extension.
async fn not_found(ui: Option<axum::Extension<Ui>>) -> Response {
    html::error_page(
        StatusCode::NOT_FOUND,
        ui.as_ref().map(|u| &u.0),
        "Not found",
        "There is no console page here.",
    )
}

/// `GET /ui/static/…` other than the stylesheet: the gate lets `/ui/static/` through
/// without a session, so this answers without one.
async fn no_such_file() -> Response {
    html::error_page(
        StatusCode::NOT_FOUND,
        None,
        "Not found",
        "There is no such file in the console.",
    )
}

async fn css() -> Response {
    let mut r = CSS.into_response();
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/css; charset=utf-8"),
    );
    h.insert(
        header::CACHE_CONTROL,
        HeaderValue::from_static("public, max-age=3600"),
    );
    r
}

/// An API error as a console page (same status, its message).
pub fn api_error(ui: &Ui, e: ApiError) -> Response {
    let title = match e.status {
        StatusCode::NOT_FOUND => "Not found",
        StatusCode::CONFLICT => "Not possible now",
        s if s.is_client_error() => "Not accepted",
        _ => "Something went wrong",
    };
    html::error_page(e.status, Some(ui), title, &e.message)
}
