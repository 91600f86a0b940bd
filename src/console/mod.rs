//! The approvals console: web pages where the person an approval waits for signs in with the
//! company's identity provider and decides. A door like the others: it converts pages and form
//! posts into the boundary's approval calls (`list_approvals`, `get_approval`,
//! `decide_approval`), which decide who may see and decide what, exactly as for the gRPC
//! Approvals service; nothing here is a second implementation of those rules.
//!
//! Served on a listener of its own (off unless `server.console` is configured), under the same
//! connection caps as the other doors. Every answer carries a strict Content-Security-Policy
//! (the console's own script and style only), refuses framing and is not cached; every form post
//! must carry its session's CSRF token and come from the console's own origin; the Host header
//! must name the console (DNS rebinding). Pages, script and style are compiled into the binary:
//! nothing is fetched from elsewhere.

mod oidc;
mod pages;
mod session;

use std::{collections::BTreeSet, net::SocketAddr, sync::Arc, time::Duration};

use axum::{
    Form, Router,
    extract::{DefaultBodyLimit, Path, Query, State, rejection::FormRejection},
    http::{HeaderMap, HeaderValue, StatusCode, header},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use serde::Deserialize;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use url::Url;

use crate::{
    admission::{connections, http_listener},
    approvals::{self, Approval, ApprovalState, DecideError, Order},
    boundary::Boundary,
    clock::SharedClock,
    identity::{Door, IdentityHandle, check_lengths},
    settings::{ConsoleConfig, SignIn, is_loopback},
    tasks::Tasks,
};
use oidc::{OidcError, Provider};
use pages::{Frame, Nav, Notice};
use session::{Login, Revoked, Sealer, Session, pkce_challenge, random_token};

/// What the console is built from.
pub struct Parts {
    pub boundary: Arc<Boundary>,
    pub identity: IdentityHandle,
    pub clock: SharedClock,
    /// The listener's own connection cap and timeouts.
    pub connections: connections::Admission,
    /// Longest tenant or subject accepted (the dev sign-in's).
    pub max_identity_bytes: usize,
}

/// The console's listener, bound, and the origin people open it at.
pub struct Bound {
    listener: TcpListener,
    pub addr: SocketAddr,
    pub origin: Url,
}

impl Bound {
    /// The page of one approval, with `{approval_id}` to replace: where the MCP door sends
    /// people by default.
    pub fn approvals_url(&self) -> String {
        format!(
            "{}/approvals/{{approval_id}}",
            self.origin.as_str().trim_end_matches('/')
        )
    }
}

/// Binds the console's listener (`listen` overrides `server.console.listen`).
pub async fn bind(config: &ConsoleConfig, listen: Option<SocketAddr>) -> std::io::Result<Bound> {
    let listener = TcpListener::bind(listen.unwrap_or(config.listen)).await?;
    let addr = listener.local_addr()?;
    let origin = match &config.public_url {
        Some(url) => url.clone(),
        None => Url::parse(&format!("http://{addr}/")).map_err(std::io::Error::other)?,
    };
    Ok(Bound {
        listener,
        addr,
        origin,
    })
}

/// Most approvals on one page of the inbox, and per section of the decided page.
const PAGE_SIZE: usize = 20;
/// The largest form post read (a reason is at most 1 KiB).
const MAX_FORM_BYTES: usize = 16 * 1024;
/// The longest approval id looked up (they are `apr_` and 32 hex digits).
const MAX_ID_BYTES: usize = 64;

const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
                   connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

struct Console {
    boundary: Arc<Boundary>,
    clock: SharedClock,
    sealer: Sealer,
    revoked: Revoked,
    origin: String,
    /// Host header values accepted.
    hosts: BTreeSet<String>,
    /// Origin header values accepted on form posts.
    origins: BTreeSet<String>,
    secure: bool,
    session_ttl: Duration,
    /// What session cookies are sealed for: this console's origin and way of signing in, so a
    /// session of a development console sharing the key is no session here.
    session_purpose: String,
    sign_in: Mode,
    max_identity_bytes: usize,
}

enum Mode {
    Oidc(Box<Provider>),
    Dev,
}

/// Serves the bound console on `listeners` until `close` is cancelled.
pub fn start(
    config: &ConsoleConfig,
    bound: Bound,
    parts: Parts,
    listeners: &Tasks,
    close: CancellationToken,
) -> Result<(), String> {
    let Bound {
        listener,
        addr,
        origin,
    } = bound;
    let sign_in = match &config.sign_in {
        SignIn::Oidc(client) => Mode::Oidc(Box::new(Provider::new(
            client.clone(),
            parts.identity.clone(),
            parts.clock.clone(),
        )?)),
        SignIn::Dev => Mode::Dev,
    };
    let origin_text = origin.as_str().trim_end_matches('/').to_owned();
    let mut hosts = BTreeSet::new();
    let mut origins = BTreeSet::from([origin_text.clone()]);
    if let Some(host) = origin.host_str() {
        hosts.insert(match origin.port() {
            Some(port) => format!("{host}:{port}"),
            None => host.to_owned(),
        });
    }
    // Not named by the operator, on loopback: it is opened by any loopback name.
    if config.public_url.is_none() && is_loopback(addr.ip()) {
        for host in ["127.0.0.1", "localhost", "[::1]"] {
            hosts.insert(format!("{host}:{}", addr.port()));
            origins.insert(format!("http://{host}:{}", addr.port()));
        }
    }
    let session_purpose = format!(
        "{SESSION_COOKIE}|{origin_text}|{}",
        match sign_in {
            Mode::Oidc(_) => "oidc",
            Mode::Dev => "dev",
        }
    );
    let console = Arc::new(Console {
        boundary: parts.boundary,
        clock: parts.clock,
        sealer: Sealer::new(config.session_key.as_deref()),
        revoked: Revoked::default(),
        secure: origin.scheme() == "https",
        origin: origin_text,
        hosts,
        origins,
        session_ttl: config.session_ttl,
        session_purpose,
        sign_in,
        max_identity_bytes: parts.max_identity_bytes,
    });
    let router = Router::new()
        .route("/", get(|| async { see_other("/approvals") }))
        .route("/approvals", get(inbox))
        .route("/approvals/{id}", get(approval).post(decide))
        .route("/decided", get(decided))
        .route("/sign-in", get(sign_in_page))
        .route("/sign-in/start", get(sign_in_start))
        .route("/sign-in/dev", post(dev_sign_in))
        .route("/callback", get(callback))
        .route("/sign-out", post(sign_out))
        .route("/assets/console.css", get(css))
        .route("/assets/console.js", get(js))
        // Browsers ask for it on every site; there is none.
        .route("/favicon.ico", get(|| async { StatusCode::NO_CONTENT }))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(MAX_FORM_BYTES))
        .layer(axum::middleware::from_fn_with_state(
            console.clone(),
            guard_host,
        ))
        .layer(axum::middleware::from_fn_with_state(
            console.clone(),
            strict_transport,
        ))
        .layer(axum::middleware::map_response(security_headers))
        .with_state(console);
    let listener = http_listener::WatchedListener {
        inner: listener,
        admission: parts.connections,
    };
    listeners.spawn(
        "console-http",
        http_listener::serve(listener, router, close),
    );
    tracing::info!(addr = %addr, url = %origin, "serving the approvals console");
    Ok(())
}

type Shared = State<Arc<Console>>;

/// A signed-in person, or why there is none.
enum Visitor {
    In(Session),
    Expired,
    Out,
}

impl Console {
    fn cookie_name(&self, base: &str) -> String {
        // __Host-: only ever set by this origin over https, for the whole site.
        match self.secure {
            true => format!("__Host-{base}"),
            false => base.to_owned(),
        }
    }

    fn cookie(&self, base: &str, value: &str, max_age: Duration, same_site: &str) -> HeaderValue {
        let secure = if self.secure { "; Secure" } else { "" };
        let text = format!(
            "{}={value}; Path=/; Max-Age={}; HttpOnly; SameSite={same_site}{secure}",
            self.cookie_name(base),
            max_age.as_secs()
        );
        // Sealed values are base64url and a dot: always a valid header value.
        HeaderValue::from_str(&text).unwrap_or_else(|_| HeaderValue::from_static(""))
    }

    fn visitor(&self, headers: &HeaderMap) -> Visitor {
        let Some(text) = cookie(headers, &self.cookie_name(SESSION_COOKIE)) else {
            return Visitor::Out;
        };
        let Some(session) = self.sealer.open::<Session>(&self.session_purpose, text) else {
            return Visitor::Out;
        };
        if session.expires_ms <= self.clock.unix_ms() || self.revoked.refuses(&session) {
            return Visitor::Expired;
        }
        Visitor::In(session)
    }

    fn frame<'a>(
        &self,
        title: &'a str,
        session: Option<&'a Session>,
        csrf: &'a str,
        current: Nav,
    ) -> Frame<'a> {
        Frame {
            title,
            session,
            csrf,
            dev: matches!(self.sign_in, Mode::Dev),
            current,
        }
    }

    /// A page with the frame around `main`; only `main` for a live update.
    fn render(
        &self,
        status: StatusCode,
        headers: &HeaderMap,
        title: &str,
        session: Option<&Session>,
        current: Nav,
        main: &str,
    ) -> Response {
        if headers.contains_key(LIVE_HEADER) {
            return html(status, main.to_owned());
        }
        let csrf = session
            .map(|s| self.sealer.csrf_token(&s.sid))
            .unwrap_or_default();
        html(
            status,
            pages::page(&self.frame(title, session, &csrf, current), main),
        )
    }

    /// A page that only says something.
    fn say(
        &self,
        status: StatusCode,
        headers: &HeaderMap,
        session: Option<&Session>,
        title: &str,
        text: &str,
        link: Option<(&str, &str)>,
    ) -> Response {
        self.render(
            status,
            headers,
            title,
            session,
            Nav::None,
            &pages::message(title, text, link),
        )
    }

    /// Where a person without a session goes: the sign-in page, back to `next` after.
    fn to_sign_in(&self, headers: &HeaderMap, visitor: &Visitor, next: &str) -> Response {
        if headers.contains_key(LIVE_HEADER) {
            return (StatusCode::UNAUTHORIZED, "signed out").into_response();
        }
        let why = match visitor {
            Visitor::Expired => "expired",
            _ => "out",
        };
        see_other(&format!(
            "/sign-in?why={why}&next={}",
            url::form_urlencoded::byte_serialize(next.as_bytes()).collect::<String>()
        ))
    }

    /// The refusal page of a boundary error.
    fn refused(&self, headers: &HeaderMap, session: &Session, err: &DecideError) -> Response {
        let (status, title) = match err {
            DecideError::MissingScope => (StatusCode::FORBIDDEN, "Not an approver"),
            DecideError::NotFound(_) => (StatusCode::NOT_FOUND, "No such approval"),
            DecideError::SelfApproval => (StatusCode::FORBIDDEN, "Not yours to decide"),
            DecideError::NotPending { .. } => (StatusCode::CONFLICT, "Already decided"),
            DecideError::NoDecision
            | DecideError::InvalidReason(_)
            | DecideError::InvalidPageToken => (StatusCode::BAD_REQUEST, "Not accepted"),
            DecideError::AuditUnavailable | DecideError::Unavailable(_) => {
                (StatusCode::SERVICE_UNAVAILABLE, "Try again shortly")
            }
        };
        let text = match err {
            DecideError::MissingScope => format!(
                "Approvals are seen and decided by people with the scope {}; you are signed in as {} of tenant {} without it.",
                approvals::APPROVE_SCOPE,
                session.subject,
                session.tenant
            ),
            DecideError::NotFound(id) => format!(
                "There is no approval {id} in tenant {}: it may have expired and been forgotten, or belong to another tenant.",
                session.tenant
            ),
            err => err.to_string(),
        };
        self.say(
            status,
            headers,
            Some(session),
            title,
            &text,
            Some(("/approvals", "Back to the waiting requests")),
        )
    }

    /// Checks a form post: from this console's origin, with the session's CSRF token.
    fn check_post(&self, headers: &HeaderMap, session: &Session, csrf: &str) -> Result<(), ()> {
        let origin_ok = headers
            .get(header::ORIGIN)
            .and_then(|o| o.to_str().ok())
            .is_some_and(|o| self.origins.contains(o));
        match origin_ok && self.sealer.csrf_matches(&session.sid, csrf) {
            true => Ok(()),
            false => Err(()),
        }
    }

    fn forged(&self, headers: &HeaderMap, session: Option<&Session>, back: &str) -> Response {
        self.say(
            StatusCode::FORBIDDEN,
            headers,
            session,
            "Form not accepted",
            "This form did not come from this console in your current session (it may be from an older sign-in, or from another site). Nothing was changed.",
            Some((back, "Back")),
        )
    }

    fn redirect_uri(&self) -> String {
        format!("{}/callback", self.origin)
    }

    fn new_login(&self, next: &str) -> Login {
        Login {
            state: random_token(),
            nonce: random_token(),
            verifier: random_token(),
            next: next.to_owned(),
            expires_ms: self.clock.unix_ms() + millis(oidc::LOGIN_TTL),
        }
    }

    fn login_cookie(&self, login: &Login) -> HeaderValue {
        self.cookie(
            LOGIN_COOKIE,
            &self.sealer.seal(LOGIN_COOKIE, login),
            oidc::LOGIN_TTL,
            "Lax",
        )
    }

    /// Signs `session`'s person in: the session cookie, the sign-in's cookie gone, and a page
    /// that moves on to `next` from this origin (a `SameSite=Strict` cookie set on the way back
    /// from the issuer is not sent on a redirect that the issuer's site began).
    fn signed_in(&self, session: &Session, next: &str) -> Response {
        let sealed = self.sealer.seal(&self.session_purpose, session);
        let mut response = html(
            StatusCode::OK,
            format!(
                "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
                 <meta http-equiv=\"refresh\" content=\"0;url={next}\">\
                 <link rel=\"stylesheet\" href=\"/assets/console.css\"><title>Signed in</title></head>\
                 <body><main><p>Signed in as {} ({}). <a href=\"{next}\">Continue</a></p></main></body></html>",
                pages::esc(&session.subject),
                pages::esc(&session.tenant),
                next = pages::esc(next),
            ),
        );
        let headers = response.headers_mut();
        headers.append(
            header::SET_COOKIE,
            self.cookie(SESSION_COOKIE, &sealed, self.session_ttl, "Strict"),
        );
        headers.append(
            header::SET_COOKIE,
            self.cookie(LOGIN_COOKIE, "", Duration::ZERO, "Lax"),
        );
        response
    }

    fn session_for(
        &self,
        tenant: &str,
        subject: &str,
        scopes: BTreeSet<String>,
        dev: bool,
    ) -> Session {
        let now = self.clock.unix_ms();
        Session {
            sid: random_token(),
            tenant: tenant.to_owned(),
            subject: subject.to_owned(),
            // Only what the console's pages are checked against: a person's other scopes
            // (groups, roles) would only make the cookie larger.
            scopes: scopes
                .into_iter()
                .filter(|scope| {
                    scope == approvals::APPROVE_SCOPE || scope == crate::emergency::ADMIN_SCOPE
                })
                .collect(),
            dev,
            issued_ms: now,
            expires_ms: now + millis(self.session_ttl),
        }
    }
}

const SESSION_COOKIE: &str = "toolgate-console";
const LOGIN_COOKIE: &str = "toolgate-console-login";
/// Sent by the page's script to get only the part of a page that changes.
const LIVE_HEADER: &str = "x-toolgate-live";

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// The value of cookie `name` in the request's `Cookie` headers.
fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
        .filter(|value| !value.is_empty())
}

fn html(status: StatusCode, body: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        body,
    )
        .into_response()
}

fn see_other(to: &str) -> Response {
    let location = HeaderValue::from_str(to).unwrap_or_else(|_| HeaderValue::from_static("/"));
    (StatusCode::SEE_OTHER, [(header::LOCATION, location)]).into_response()
}

/// A console path to go back to after signing in; anything else is the inbox (no open redirect).
fn local_path(next: Option<&str>) -> String {
    match next {
        Some(path)
            if path.starts_with('/')
                && !path.starts_with("//")
                && path.len() <= 256
                && path
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"/_-.?=&".contains(&b)) =>
        {
            path.to_owned()
        }
        _ => "/approvals".to_owned(),
    }
}

fn valid_id(id: &str) -> bool {
    id.len() <= MAX_ID_BYTES && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Refuses a request whose Host is not the console's (DNS rebinding).
async fn guard_host(
    State(console): Shared,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let host = request
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .or_else(|| request.uri().authority().map(|a| a.as_str()));
    match host.is_some_and(|h| console.hosts.contains(&h.to_ascii_lowercase())) {
        true => next.run(request).await,
        false => (
            StatusCode::MISDIRECTED_REQUEST,
            "this console is not served under that host name\n",
        )
            .into_response(),
    }
}

async fn security_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    for (name, value) in [
        ("content-security-policy", CSP),
        ("x-frame-options", "DENY"),
        ("x-content-type-options", "nosniff"),
        // Not no-referrer: under it a browser sends `Origin: null` with form posts.
        ("referrer-policy", "same-origin"),
        ("cross-origin-opener-policy", "same-origin"),
        ("cross-origin-resource-policy", "same-origin"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    headers
        .entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    response
}

/// Over https, browsers are told to come back over https only.
async fn strict_transport(
    State(console): Shared,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let mut response = next.run(request).await;
    if console.secure {
        response.headers_mut().insert(
            header::STRICT_TRANSPORT_SECURITY,
            HeaderValue::from_static("max-age=31536000"),
        );
    }
    response
}

async fn css() -> Response {
    asset(
        "text/css; charset=utf-8",
        include_str!("assets/console.css"),
    )
}

async fn js() -> Response {
    asset(
        "text/javascript; charset=utf-8",
        include_str!("assets/console.js"),
    )
}

fn asset(kind: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, kind),
            (header::CACHE_CONTROL, "private, max-age=300"),
        ],
        body,
    )
        .into_response()
}

async fn not_found(State(console): Shared, headers: HeaderMap) -> Response {
    let visitor = console.visitor(&headers);
    let session = match &visitor {
        Visitor::In(session) => Some(session),
        _ => None,
    };
    console.say(
        StatusCode::NOT_FOUND,
        &headers,
        session,
        "Not found",
        "There is no such page in the approvals console.",
        Some(("/approvals", "Go to the waiting requests")),
    )
}

#[derive(Deserialize)]
struct InboxQuery {
    after: Option<String>,
}

async fn inbox(
    State(console): Shared,
    headers: HeaderMap,
    Query(query): Query<InboxQuery>,
) -> Response {
    let visitor = console.visitor(&headers);
    let Visitor::In(session) = visitor else {
        return console.to_sign_in(&headers, &visitor, "/approvals");
    };
    let after = match query.after.as_deref() {
        None | Some("") => None,
        Some(token) => match approvals::Cursor::parse(token) {
            Some(cursor) => Some(cursor),
            None => {
                return console.refused(&headers, &session, &DecideError::InvalidPageToken);
            }
        },
    };
    let page = console
        .boundary
        .list_approvals(
            &session.caller(),
            Some(ApprovalState::Pending),
            Order::NewestFirst,
            PAGE_SIZE,
            after.as_ref(),
        )
        .await;
    match page {
        Ok(page) => {
            let next = page.next.map(|c| c.token());
            console.render(
                StatusCode::OK,
                &headers,
                "Waiting",
                Some(&session),
                Nav::Inbox,
                &pages::inbox(&page.approvals, &session, next.as_deref()),
            )
        }
        Err(err) => console.refused(&headers, &session, &err),
    }
}

async fn approval(State(console): Shared, headers: HeaderMap, Path(id): Path<String>) -> Response {
    let visitor = console.visitor(&headers);
    let Visitor::In(session) = visitor else {
        let next = match valid_id(&id) {
            true => format!("/approvals/{id}"),
            false => "/approvals".to_owned(),
        };
        return console.to_sign_in(&headers, &visitor, &next);
    };
    show(
        &console,
        &headers,
        &session,
        &id,
        StatusCode::OK,
        &Notice::None,
    )
    .await
}

/// The page of approval `id`, with `notice` above it.
async fn show(
    console: &Console,
    headers: &HeaderMap,
    session: &Session,
    id: &str,
    status: StatusCode,
    notice: &Notice,
) -> Response {
    if !valid_id(id) {
        return console.refused(
            headers,
            session,
            &DecideError::NotFound(id.chars().take(MAX_ID_BYTES).collect()),
        );
    }
    match console.boundary.get_approval(&session.caller(), id).await {
        Ok(approval) => page_of(console, headers, session, &approval, status, notice),
        Err(err) => console.refused(headers, session, &err),
    }
}

fn page_of(
    console: &Console,
    headers: &HeaderMap,
    session: &Session,
    approval: &Approval,
    status: StatusCode,
    notice: &Notice,
) -> Response {
    let csrf = console.sealer.csrf_token(&session.sid);
    console.render(
        status,
        headers,
        &approval.binding.tool,
        Some(session),
        Nav::None,
        &pages::approval(approval, session, &csrf, notice),
    )
}

#[derive(Deserialize)]
struct Decision {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    decision: String,
    #[serde(default)]
    reason: String,
}

async fn decide(
    State(console): Shared,
    headers: HeaderMap,
    Path(id): Path<String>,
    form: Result<Form<Decision>, FormRejection>,
) -> Response {
    let back = match valid_id(&id) {
        true => format!("/approvals/{id}"),
        false => "/approvals".to_owned(),
    };
    let session = match console.visitor(&headers) {
        Visitor::In(session) => session,
        visitor => {
            let why = match visitor {
                Visitor::Expired => "Your session expired before this was sent.",
                _ => "You are not signed in.",
            };
            let sign_in = format!(
                "/sign-in?next={}",
                url::form_urlencoded::byte_serialize(back.as_bytes()).collect::<String>()
            );
            return console.say(
                StatusCode::UNAUTHORIZED,
                &headers,
                None,
                "Sign in again",
                &format!("{why} Nothing was decided; sign in and decide again."),
                Some((&sign_in, "Sign in")),
            );
        }
    };
    let Ok(Form(form)) = form else {
        return console.forged(&headers, Some(&session), &back);
    };
    if console.check_post(&headers, &session, &form.csrf).is_err() {
        return console.forged(&headers, Some(&session), &back);
    }
    let approve = match form.decision.as_str() {
        "approve" => Some(true),
        "reject" => Some(false),
        _ => None,
    };
    let decided = console
        .boundary
        .decide_approval(&session.caller(), &id, approve, &form.reason, Door::Console)
        .await;
    match decided {
        Ok(approval) => page_of(
            &console,
            &headers,
            &session,
            &approval,
            StatusCode::OK,
            &Notice::Decided,
        ),
        // Shown with the approval, so the person sees where it stands.
        Err(
            err @ (DecideError::SelfApproval
            | DecideError::NotPending { .. }
            | DecideError::InvalidReason(_)
            | DecideError::NoDecision),
        ) => {
            let status = match err {
                DecideError::NotPending { .. } => StatusCode::CONFLICT,
                DecideError::SelfApproval => StatusCode::FORBIDDEN,
                _ => StatusCode::BAD_REQUEST,
            };
            let why = match &err {
                DecideError::NotPending { .. } => {
                    "it was already decided (or has expired) before your decision arrived."
                        .to_owned()
                }
                err => err.to_string(),
            };
            show(
                &console,
                &headers,
                &session,
                &id,
                status,
                &Notice::Refused(why),
            )
            .await
        }
        Err(err) => console.refused(&headers, &session, &err),
    }
}

async fn decided(State(console): Shared, headers: HeaderMap) -> Response {
    let visitor = console.visitor(&headers);
    let Visitor::In(session) = visitor else {
        return console.to_sign_in(&headers, &visitor, "/decided");
    };
    let caller = session.caller();
    let mut sections = Vec::new();
    for (title, state) in [
        (
            "Approved, waiting for the agent's call",
            ApprovalState::Approved,
        ),
        ("Approved and used", ApprovalState::Used),
        ("Rejected", ApprovalState::Rejected),
    ] {
        match console
            .boundary
            .list_approvals(&caller, Some(state), Order::NewestFirst, PAGE_SIZE, None)
            .await
        {
            Ok(page) => sections.push((title, page.approvals)),
            Err(err) => return console.refused(&headers, &session, &err),
        }
    }
    // The emergency denies in force, for those the Controls service would show them to (the
    // admin scope: their tenant's, or every tenant's for the platform's operators); read only.
    let denies = console.boundary.list_emergency_denies(&caller).ok();
    console.render(
        StatusCode::OK,
        &headers,
        "Decided",
        Some(&session),
        Nav::Decided,
        &pages::decided(&sections, denies.as_deref()),
    )
}

#[derive(Deserialize)]
struct SignInQuery {
    next: Option<String>,
    why: Option<String>,
}

async fn sign_in_page(
    State(console): Shared,
    headers: HeaderMap,
    Query(query): Query<SignInQuery>,
) -> Response {
    let next = local_path(query.next.as_deref());
    if let Visitor::In(_) = console.visitor(&headers) {
        return see_other(&next);
    }
    let why = match query.why.as_deref() {
        Some("expired") => "Your session has expired. Sign in again to go on.",
        _ => "Sign in to see and decide the requests waiting for an approver.",
    };
    match &console.sign_in {
        Mode::Oidc(provider) => {
            let start = format!(
                "/sign-in/start?next={}",
                url::form_urlencoded::byte_serialize(next.as_bytes()).collect::<String>()
            );
            let issuer = provider.issuer().as_str().trim_end_matches('/').to_owned();
            console.render(
                StatusCode::OK,
                &headers,
                "Sign in",
                None,
                Nav::None,
                &pages::sign_in(why, Some((&issuer, &start)), None),
            )
        }
        Mode::Dev => {
            let login = console.new_login(&next);
            let mut response = console.render(
                StatusCode::OK,
                &headers,
                "Sign in",
                None,
                Nav::None,
                &pages::sign_in(why, None, Some((&login.state, &next))),
            );
            response
                .headers_mut()
                .append(header::SET_COOKIE, console.login_cookie(&login));
            response
        }
    }
}

async fn sign_in_start(
    State(console): Shared,
    headers: HeaderMap,
    Query(query): Query<SignInQuery>,
) -> Response {
    let next = local_path(query.next.as_deref());
    let Mode::Oidc(provider) = &console.sign_in else {
        return see_other(&format!("/sign-in?next={next}"));
    };
    let login = console.new_login(&next);
    match provider
        .authorization_url(
            &console.redirect_uri(),
            &login.state,
            &login.nonce,
            &pkce_challenge(&login.verifier),
        )
        .await
    {
        Ok(url) => {
            let mut response = see_other(url.as_str());
            response
                .headers_mut()
                .append(header::SET_COOKIE, console.login_cookie(&login));
            response
        }
        Err(err) => idp_failed(&console, &headers, &err, &next),
    }
}

fn idp_failed(console: &Console, headers: &HeaderMap, err: &OidcError, next: &str) -> Response {
    tracing::warn!(error = %err, "console sign-in failed");
    // What was wrong with a token is for the operator's log, not for whoever is signing in.
    let shown = match err {
        OidcError::Token(_) => "The identity provider's answer did not name a person this console accepts; nothing was signed in. The sidecar's log says why.".to_owned(),
        err => err.to_string(),
    };
    let status = match err {
        OidcError::Unreachable { .. } => StatusCode::BAD_GATEWAY,
        OidcError::Refused(_) | OidcError::Token(_) => StatusCode::FORBIDDEN,
    };
    let again = format!(
        "/sign-in?next={}",
        url::form_urlencoded::byte_serialize(next.as_bytes()).collect::<String>()
    );
    console.say(
        status,
        headers,
        None,
        "Sign-in failed",
        &shown,
        Some((&again, "Try again")),
    )
}

#[derive(Deserialize)]
struct Callback {
    code: Option<String>,
    state: Option<String>,
    error: Option<String>,
}

async fn callback(
    State(console): Shared,
    headers: HeaderMap,
    Query(query): Query<Callback>,
) -> Response {
    let Mode::Oidc(provider) = &console.sign_in else {
        return see_other("/sign-in");
    };
    let login = cookie(&headers, &console.cookie_name(LOGIN_COOKIE))
        .and_then(|text| console.sealer.open::<Login>(LOGIN_COOKIE, text))
        .filter(|login| login.expires_ms > console.clock.unix_ms());
    let Some(login) = login else {
        return console.say(
            StatusCode::BAD_REQUEST,
            &headers,
            None,
            "Sign-in expired",
            "This sign-in was not started here, or took longer than ten minutes. Nothing was signed in.",
            Some(("/sign-in", "Sign in")),
        );
    };
    if query.state.as_deref() != Some(login.state.as_str()) {
        return console.forged(&headers, None, "/sign-in");
    }
    if let Some(error) = query.error.as_deref() {
        let err = OidcError::Refused(error.chars().take(64).collect());
        return idp_failed(&console, &headers, &err, &login.next);
    }
    let Some(code) = query.code.as_deref() else {
        let err = OidcError::Refused("the answer holds no code".into());
        return idp_failed(&console, &headers, &err, &login.next);
    };
    match provider
        .sign_in(code, &login.verifier, &console.redirect_uri(), &login.nonce)
        .await
    {
        Ok(caller) => {
            let session = console.session_for(
                &caller.tenant,
                &caller.subject,
                caller.scopes.clone(),
                false,
            );
            tracing::info!(tenant = %session.tenant, subject = %session.subject, "signed in to the approvals console");
            console.signed_in(&session, &login.next)
        }
        Err(err) => idp_failed(&console, &headers, &err, &login.next),
    }
}

#[derive(Deserialize)]
struct DevSignIn {
    #[serde(default)]
    state: String,
    #[serde(default)]
    next: String,
    #[serde(default)]
    tenant: String,
    #[serde(default)]
    subject: String,
    #[serde(default)]
    scopes: String,
}

async fn dev_sign_in(
    State(console): Shared,
    headers: HeaderMap,
    form: Result<Form<DevSignIn>, FormRejection>,
) -> Response {
    if !matches!(console.sign_in, Mode::Dev) {
        return see_other("/sign-in");
    }
    let login = cookie(&headers, &console.cookie_name(LOGIN_COOKIE))
        .and_then(|text| console.sealer.open::<Login>(LOGIN_COOKIE, text))
        .filter(|login| login.expires_ms > console.clock.unix_ms());
    let origin_ok = headers
        .get(header::ORIGIN)
        .and_then(|o| o.to_str().ok())
        .is_some_and(|o| console.origins.contains(o));
    let (Some(login), Ok(Form(form)), true) = (login, form, origin_ok) else {
        return console.forged(&headers, None, "/sign-in");
    };
    if form.state != login.state {
        return console.forged(&headers, None, "/sign-in");
    }
    let session = console.session_for(
        form.tenant.trim(),
        form.subject.trim(),
        crate::identity::split_scopes(&form.scopes.replace(',', " ")),
        true,
    );
    if session.tenant.is_empty() || session.subject.is_empty() {
        return console.say(
            StatusCode::BAD_REQUEST,
            &headers,
            None,
            "Not signed in",
            "A tenant and a subject are needed.",
            Some(("/sign-in", "Try again")),
        );
    }
    if let Err(err) = check_lengths(&session.caller(), console.max_identity_bytes) {
        return console.say(
            StatusCode::BAD_REQUEST,
            &headers,
            None,
            "Not signed in",
            &err.to_string(),
            Some(("/sign-in", "Try again")),
        );
    }
    console.signed_in(&session, &local_path(Some(&form.next)))
}

#[derive(Deserialize)]
struct SignOut {
    #[serde(default)]
    csrf: String,
}

async fn sign_out(
    State(console): Shared,
    headers: HeaderMap,
    form: Result<Form<SignOut>, FormRejection>,
) -> Response {
    let Visitor::In(session) = console.visitor(&headers) else {
        let mut response = see_other("/sign-in");
        response.headers_mut().append(
            header::SET_COOKIE,
            console.cookie(SESSION_COOKIE, "", Duration::ZERO, "Strict"),
        );
        return response;
    };
    let csrf = form.map(|Form(f)| f.csrf).unwrap_or_default();
    if console.check_post(&headers, &session, &csrf).is_err() {
        return console.forged(&headers, Some(&session), "/approvals");
    }
    console.revoked.revoke(&session, console.clock.unix_ms());
    let mut response = console.say(
        StatusCode::OK,
        &headers,
        None,
        "Signed out",
        "You are signed out of the approvals console.",
        Some(("/sign-in", "Sign in again")),
    );
    response.headers_mut().append(
        header::SET_COOKIE,
        console.cookie(SESSION_COOKIE, "", Duration::ZERO, "Strict"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_console_paths_are_gone_back_to() {
        assert_eq!(local_path(Some("/approvals/apr_1")), "/approvals/apr_1");
        assert_eq!(local_path(Some("/decided")), "/decided");
        for elsewhere in [
            "//evil.example/x",
            "https://evil.example",
            "/\\evil",
            "javascript:alert(1)",
            "",
        ] {
            assert_eq!(local_path(Some(elsewhere)), "/approvals", "{elsewhere}");
        }
        assert_eq!(local_path(None), "/approvals");
    }

    #[test]
    fn cookies_are_read_by_exact_name() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::COOKIE,
            HeaderValue::from_static("a=1; toolgate-console-login=L; toolgate-console=S"),
        );
        assert_eq!(cookie(&headers, "toolgate-console"), Some("S"));
        assert_eq!(cookie(&headers, "toolgate-console-login"), Some("L"));
        assert_eq!(cookie(&headers, "toolgate"), None);
    }
}
