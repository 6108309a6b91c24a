//! Dashboard and API login against a real collector (`serve_with_store`) over HTTP:
//! bearer tokens, the login form and its session cookie, roles, logout, and the loopback
//! default.

mod common;

use common::*;
use gpufleet_collector::ServeOptions;
use gpufleet_collector::auth::tokens::{self, Role, TokensCommand};
use gpufleet_collector::auth::web::WebAuthMode;
use reqwest::StatusCode;
use reqwest::redirect::Policy;

async fn start(web_auth: WebAuthMode) -> TestCollector {
    start_collector(ServeOptions {
        web_auth,
        ..Default::default()
    })
    .await
}

async fn token(c: &TestCollector, name: &str, role: Role) -> String {
    let out = tokens::run_on(
        c.store.as_ref(),
        TokensCommand::Add {
            node: name.to_owned(),
            role,
        },
    )
    .await
    .expect("tokens add");
    out.lines().next().expect("token").to_owned()
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(Policy::none())
        .build()
        .expect("client")
}

#[tokio::test]
async fn viewers_log_in_with_a_token_and_roles_limit_what_they_do() {
    let c = start(WebAuthMode::Required).await;
    let base = format!("http://{}", c.http);
    let http = client();
    let viewer = token(&c, "alice", Role::Viewer).await;
    let admin = token(&c, "root", Role::Admin).await;
    let agent = token(&c, "gpu-node-01", Role::Agent).await;
    let revoked = token(&c, "bob", Role::Viewer).await;
    let (revoked_id, _) = tokens::parse(&revoked).expect("shape");
    tokens::run_on(
        c.store.as_ref(),
        TokensCommand::Revoke {
            id: revoked_id.to_owned(),
        },
    )
    .await
    .expect("revoke");

    // No credential: the API says 401 (JSON), pages redirect to the login form.
    let r = http
        .get(format!("{base}/api/v1/nodes"))
        .send()
        .await
        .expect("get");
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        r.headers()
            .get("www-authenticate")
            .and_then(|v| v.to_str().ok()),
        Some("Bearer")
    );
    assert!(r.text().await.expect("body").contains("log in at /login"));
    for path in ["/metrics", "/api/v1/health"] {
        let r = http.get(format!("{base}{path}")).send().await.expect("get");
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{path}");
    }
    let r = http.get(format!("{base}/")).send().await.expect("get");
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        r.headers().get("location").and_then(|v| v.to_str().ok()),
        Some("/login")
    );
    let r = http.get(format!("{base}/login")).send().await.expect("get");
    assert_eq!(r.status(), StatusCode::OK);
    assert!(r.headers().contains_key("content-security-policy"));
    let page = r.text().await.expect("page");
    assert!(
        page.contains("<form method=\"post\" action=\"/login\">"),
        "{page}"
    );
    assert!(
        !page.contains("<script") && !page.contains("<style"),
        "CSP-clean: {page}"
    );

    // Bearer tokens: viewer and admin read; agent and revoked tokens do not.
    for (what, tok, status) in [
        ("viewer", &viewer, StatusCode::OK),
        ("admin", &admin, StatusCode::OK),
        ("agent", &agent, StatusCode::UNAUTHORIZED),
        ("revoked", &revoked, StatusCode::UNAUTHORIZED),
    ] {
        let r = http
            .get(format!("{base}/api/v1/nodes"))
            .bearer_auth(tok)
            .send()
            .await
            .expect("get");
        assert_eq!(r.status(), status, "{what} token");
        let body = r.text().await.expect("body");
        assert!(!body.contains(tok.as_str()), "the token is never echoed");
    }

    // Viewers use safe methods only; admins may change things (here: no such route).
    let r = http
        .post(format!("{base}/api/v1/recompute"))
        .bearer_auth(&viewer)
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let r = http
        .post(format!("{base}/api/v1/recompute"))
        .bearer_auth(&admin)
        .send()
        .await
        .expect("post");
    assert!(
        r.status() != StatusCode::FORBIDDEN && r.status() != StatusCode::UNAUTHORIZED,
        "admin passes the auth layer: {}",
        r.status()
    );

    // The login form: a wrong token is refused, a viewer token sets the session cookie.
    let r = http
        .post(format!("{base}/login"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body("token=gft_00_00")
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert!(r.headers().get("set-cookie").is_none());
    let r = http
        .post(format!("{base}/login"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("token={viewer}"))
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let set = r
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .expect("a session cookie")
        .to_owned();
    assert!(
        set.contains("HttpOnly") && set.contains("SameSite=Strict"),
        "{set}"
    );
    assert!(!set.contains("Secure"), "plain HTTP: no Secure flag: {set}");
    assert!(
        !set.contains(viewer.as_str()),
        "the cookie is a session id, not the token"
    );
    let session = set.split(';').next().expect("name=value").to_owned();
    let r = http
        .get(format!("{base}/"))
        .header("cookie", &session)
        .send()
        .await
        .expect("get");
    assert_eq!(r.status(), StatusCode::OK, "logged in");

    // Logout ends the session.
    let r = http
        .post(format!("{base}/logout"))
        .header("cookie", &session)
        .send()
        .await
        .expect("post");
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let r = http
        .get(format!("{base}/api/v1/nodes"))
        .header("cookie", &session)
        .send()
        .await
        .expect("get");
    assert_eq!(
        r.status(),
        StatusCode::UNAUTHORIZED,
        "session gone after logout"
    );
    c.shutdown.cancel();
}

#[tokio::test]
async fn on_loopback_the_dashboard_needs_no_login_by_default() {
    let c = start(WebAuthMode::Auto).await;
    let r = client()
        .get(format!("http://{}/api/v1/nodes", c.http))
        .send()
        .await
        .expect("get");
    assert_eq!(r.status(), StatusCode::OK);
    c.shutdown.cancel();
}
