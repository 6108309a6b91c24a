//! Dashboard and API authentication, as one layer around the whole router (routes added
//! later are covered without doing anything).
//!
//! - Off when the HTTP listener is on loopback (default `Auto`), or with
//!   `--allow-anonymous-viewers`; required otherwise.
//! - Credentials: a `viewer` or `admin` token ([`crate::auth::tokens`]) sent as
//!   `Authorization: Bearer gft_…` (API clients), or exchanged once at `POST /login` for a
//!   session cookie (`HttpOnly; SameSite=Strict; Path=/`, plus `Secure` under TLS). Sessions
//!   live in memory for 12 h (a restart logs everyone out).
//! - Roles: `viewer` may use safe methods (GET, HEAD); anything else needs `admin`.
//! - `/livez` and `/readyz` (probes that say only `ok`) need no credential.
//! - Without a credential: API paths (`/api/…`, `/metrics`) answer 401 with a JSON error;
//!   pages redirect to `/login`.

use crate::auth::tokens::{self, Role};
use crate::store::TokenStore;
use axum::Router;
use axum::body::to_bytes;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Redirect, Response};
use ring::rand::{SecureRandom, SystemRandom};
use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::{error, warn};

/// Name of the session cookie.
pub const COOKIE: &str = "gpufleet_session";
/// How long a session lasts.
const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// Most sessions held; beyond, the oldest are dropped (their users log in again).
const MAX_SESSIONS: usize = 10_000;

/// Whether viewers must log in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WebAuthMode {
    /// Required unless the HTTP listener is on a loopback address.
    #[default]
    Auto,
    Required,
    /// Anyone who reaches the port reads everything (`--allow-anonymous-viewers`).
    Off,
}

impl WebAuthMode {
    /// `Auto` decided for a listener on `loopback` or not.
    pub fn resolve(self, loopback: bool) -> WebAuthMode {
        match self {
            WebAuthMode::Auto if loopback => WebAuthMode::Off,
            WebAuthMode::Auto => WebAuthMode::Required,
            other => other,
        }
    }
}

/// The authentication layer's state.
#[derive(Debug)]
pub struct WebAuth {
    store: Arc<dyn TokenStore>,
    required: bool,
    /// The listener uses TLS: cookies get `Secure`.
    tls: bool,
    sessions: Mutex<HashMap<String, (Role, Instant)>>,
}

impl WebAuth {
    /// `mode` must be resolved (not `Auto`); `Auto` counts as required.
    pub fn new(store: Arc<dyn TokenStore>, mode: WebAuthMode, tls: bool) -> Arc<WebAuth> {
        Arc::new(WebAuth {
            store,
            required: mode != WebAuthMode::Off,
            tls,
            sessions: Mutex::new(HashMap::new()),
        })
    }

    /// The role a bearer token grants; `Err` with the reason when it grants none.
    async fn token_role(&self, token: &str) -> Result<Role, Response> {
        let denied = |why: &str| unauthorized(why);
        let (id, secret) = tokens::parse(token).ok_or_else(|| denied("malformed token"))?;
        let record = self.store.agent_token(id).await.map_err(|e| {
            error!(error = %e, "cannot look up a viewer token");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                axum::Json(
                    serde_json::json!({"error": "cannot check credentials now; retry later"}),
                ),
            )
                .into_response()
        })?;
        let Some(record) = record.filter(|r| tokens::secret_matches(r, secret)) else {
            warn!(token_id = %id, "web login refused: unknown token");
            return Err(denied("unknown token"));
        };
        if record.revoked_ms.is_some() {
            return Err(denied("this token was revoked"));
        }
        match Role::parse(&record.role) {
            Some(role @ (Role::Viewer | Role::Admin)) => Ok(role),
            _ => Err(denied(
                "not a viewer or admin token (make one with `tokens add NAME --role viewer`)",
            )),
        }
    }

    fn session_role(&self, headers: &HeaderMap) -> Option<Role> {
        let sid = cookie(headers, COOKIE)?;
        let mut sessions = self.sessions.lock().ok()?;
        match sessions.get(sid) {
            Some(&(role, expires)) if expires > Instant::now() => Some(role),
            Some(_) => {
                sessions.remove(sid);
                None
            }
            None => None,
        }
    }

    fn new_session(&self, role: Role) -> Option<String> {
        let mut bytes = [0u8; 32];
        SystemRandom::new().fill(&mut bytes).ok()?;
        let mut sid = String::with_capacity(64);
        for b in bytes {
            let _ = write!(sid, "{b:02x}");
        }
        let now = Instant::now();
        let mut sessions = self.sessions.lock().ok()?;
        sessions.retain(|_, (_, expires)| *expires > now);
        if sessions.len() >= MAX_SESSIONS {
            let oldest = sessions
                .iter()
                .min_by_key(|(_, (_, e))| *e)
                .map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                sessions.remove(&k);
            }
        }
        sessions.insert(sid.clone(), (role, now + SESSION_TTL));
        Some(sid)
    }

    fn cookie_header(&self, value: &str, max_age: u64) -> HeaderValue {
        let secure = if self.tls { "; Secure" } else { "" };
        let text = format!(
            "{COOKIE}={value}; HttpOnly; SameSite=Strict; Path=/; Max-Age={max_age}{secure}"
        );
        HeaderValue::from_str(&text).unwrap_or_else(|_| HeaderValue::from_static(""))
    }
}

/// `router` behind the authentication layer.
pub fn with_auth(router: Router, auth: Arc<WebAuth>) -> Router {
    router.layer(middleware::from_fn_with_state(auth, require))
}

fn unauthorized(why: &str) -> Response {
    let mut r = (
        StatusCode::UNAUTHORIZED,
        axum::Json(serde_json::json!({
            "error": format!("{why}: log in at /login, or send `Authorization: Bearer <viewer token>`"),
        })),
    )
        .into_response();
    r.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    r
}

fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|kv| kv.trim().split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
}

async fn require(State(auth): State<Arc<WebAuth>>, request: Request, next: Next) -> Response {
    match (request.method(), request.uri().path()) {
        (&Method::GET, "/login") => return login_page(None),
        (&Method::POST, "/login") => return login(&auth, request).await,
        // Orchestrators' probes carry no credential; they reveal only "ok".
        (&Method::GET | &Method::HEAD, "/livez" | "/readyz") => return next.run(request).await,
        (&Method::POST, "/logout") => {
            if let (Some(sid), Ok(mut s)) =
                (cookie(request.headers(), COOKIE), auth.sessions.lock())
            {
                s.remove(sid);
            }
            let mut r = Redirect::to("/login").into_response();
            r.headers_mut()
                .insert(header::SET_COOKIE, auth.cookie_header("", 0));
            return r;
        }
        _ => {}
    }
    if !auth.required {
        return next.run(request).await;
    }
    let role = match bearer(request.headers()) {
        Some(token) => match auth.token_role(token).await {
            Ok(role) => Some(role),
            Err(response) => return response,
        },
        None => auth.session_role(request.headers()),
    };
    let path = request.uri().path();
    let api = path.starts_with("/api/") || path == "/metrics";
    match role {
        None if api => unauthorized("authentication required"),
        None => Redirect::to("/login").into_response(),
        Some(Role::Viewer) if !matches!(*request.method(), Method::GET | Method::HEAD) => (
            StatusCode::FORBIDDEN,
            axum::Json(
                serde_json::json!({"error": "this needs an admin token; yours is a viewer token"}),
            ),
        )
            .into_response(),
        Some(_) => next.run(request).await,
    }
}

/// `POST /login` with a form body `token=gft_…`: sets the session cookie.
async fn login(auth: &WebAuth, request: Request) -> Response {
    let Ok(body) = to_bytes(request.into_body(), 4096).await else {
        return login_page(Some("the login form is too large"));
    };
    let token = std::str::from_utf8(&body)
        .ok()
        .and_then(|b| b.split('&').find_map(|kv| kv.strip_prefix("token=")))
        .map(str::trim)
        .unwrap_or_default();
    match auth.token_role(token).await {
        Ok(role) => match auth.new_session(role) {
            Some(sid) => {
                let mut r = Redirect::to("/").into_response();
                r.headers_mut().insert(
                    header::SET_COOKIE,
                    auth.cookie_header(&sid, SESSION_TTL.as_secs()),
                );
                r
            }
            None => login_page(Some("cannot create a session now; retry")),
        },
        Err(_) => {
            let mut r = login_page(Some("that token is not a valid viewer or admin token"));
            *r.status_mut() = StatusCode::UNAUTHORIZED;
            r
        }
    }
}

/// The login page: a plain form, no script or inline style (the CSP forbids them).
fn login_page(error: Option<&str>) -> Response {
    let error = error
        .map(|e| format!("<p role=\"alert\">{}</p>", escape_html(e)))
        .unwrap_or_default();
    let html = format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>gpufleet: log in</title></head><body><h1>gpufleet</h1>{error}\
         <form method=\"post\" action=\"/login\"><label>Token \
         <input type=\"password\" name=\"token\" autocomplete=\"current-password\" required>\
         </label> <button type=\"submit\">Log in</button></form>\
         <p>Ask an administrator for a viewer token \
         (<code>gpufleet-collector tokens add NAME --role viewer</code>).</p></body></html>"
    );
    Html(html).into_response()
}

/// Escapes text for HTML element content and attribute values (the login page).
fn escape_html(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn login_page_text_is_escaped() {
        assert_eq!(
            escape_html(r#"<script>"x"&'y'</script>"#),
            "&lt;script&gt;&quot;x&quot;&amp;&#39;y&#39;&lt;/script&gt;"
        );
    }

    #[tokio::test]
    async fn session_cookies_are_secure_under_tls_only() {
        let store = crate::store::open("sqlite::memory:").await.expect("store");
        let tls = WebAuth::new(store.clone(), WebAuthMode::Required, true);
        let plain = WebAuth::new(store, WebAuthMode::Required, false);
        let secure = tls.cookie_header("abc", 60);
        let secure = secure.to_str().expect("ascii");
        assert!(secure.ends_with("; Secure"), "{secure}");
        assert!(secure.contains("HttpOnly; SameSite=Strict"), "{secure}");
        let insecure = plain.cookie_header("abc", 60);
        assert!(!insecure.to_str().expect("ascii").contains("Secure"));
    }
}
