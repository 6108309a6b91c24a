//! Who may do what: agent, viewer and admin tokens, the dashboard and API login, and the
//! security headers every HTTP response carries.
//!
//! - [`tokens`]: `gft_<id>_<secret>` tokens (stored hashed) and the `tokens` commands.
//! - [`web`]: dashboard and API authentication (viewer/admin tokens, session cookies).
//! - [`security_headers`]: CSP, nosniff and the other headers on every HTTP response.

pub mod security_headers;
pub mod tokens;
pub mod web;
