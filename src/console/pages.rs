//! The console's pages, as HTML text: every value from a caller, an approver, a catalog or an
//! identity provider goes through [`esc`]. No inline script or style (the Content-Security-Policy
//! allows only the console's own files); the pages work without script, which only adds the
//! countdowns and live updates.

use std::fmt::Write;

use crate::{
    approvals::{Approval, ApprovalState},
    emergency::EmergencyDeny,
};

use super::session::Session;

/// Text made safe for HTML content and quoted attribute values.
pub fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
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

/// A time as people read it (UTC), in a `<time>` element; `countdown` adds the live "in 4m 2s".
fn time(ms: i64, countdown: bool) -> String {
    let text = chrono::DateTime::from_timestamp_millis(ms)
        .map(|t| t.format("%Y-%m-%d %H:%M:%S UTC").to_string())
        .unwrap_or_else(|| "unknown".to_owned());
    match countdown {
        true => format!("<time data-countdown=\"{ms}\">{text}</time>"),
        false => format!("<time>{text}</time>"),
    }
}

/// What a page's frame shows of who is signed in, and the sign-out form.
pub struct Frame<'a> {
    pub title: &'a str,
    pub session: Option<&'a Session>,
    pub csrf: &'a str,
    /// Signed in with the development form: said on every page.
    pub dev: bool,
    /// Which navigation entry is this page.
    pub current: Nav,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Nav {
    Inbox,
    Decided,
    None,
}

/// A whole page around `main` (the part live updates replace).
pub fn page(frame: &Frame<'_>, main: &str) -> String {
    let mut out = String::with_capacity(main.len() + 2048);
    let _ = write!(
        out,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{} · toolgate approvals</title>\
         <link rel=\"stylesheet\" href=\"/assets/console.css\">\
         <script src=\"/assets/console.js\" defer></script></head><body>",
        esc(frame.title)
    );
    if frame.dev {
        out.push_str(
            "<p class=\"dev\" role=\"note\"><strong>Development sign-in.</strong> \
             Anyone who reaches this page can be anyone: never serve it to a network.</p>",
        );
    }
    out.push_str("<header><a class=\"brand\" href=\"/approvals\">toolgate approvals</a>");
    if let Some(session) = frame.session {
        let link = |nav: Nav, href: &str, text: &str| {
            let current = match nav == frame.current {
                true => " aria-current=\"page\"",
                false => "",
            };
            format!("<a href=\"{href}\"{current}>{text}</a>")
        };
        let _ = write!(
            out,
            "<nav aria-label=\"Console\">{}{}</nav>\
             <form class=\"who\" method=\"post\" action=\"/sign-out\">\
             <span>{} <span class=\"muted\">({})</span></span>\
             <input type=\"hidden\" name=\"csrf\" value=\"{}\">\
             <button type=\"submit\">Sign out</button></form>",
            link(Nav::Inbox, "/approvals", "Waiting"),
            link(Nav::Decided, "/decided", "Decided"),
            esc(&session.subject),
            esc(&session.tenant),
            esc(frame.csrf),
        );
    }
    let _ = write!(
        out,
        "</header><main id=\"main\">{main}</main></body></html>"
    );
    out
}

/// A page that only says something: an error, a sign-in step.
pub fn message(title: &str, text: &str, link: Option<(&str, &str)>) -> String {
    let mut out = format!("<h1>{}</h1><p>{}</p>", esc(title), esc(text));
    if let Some((href, label)) = link {
        let _ = write!(
            out,
            "<p><a class=\"button\" href=\"{}\">{}</a></p>",
            esc(href),
            esc(label)
        );
    }
    out
}

/// The inbox: pending approvals, newest first, one page.
pub fn inbox(approvals: &[Approval], me: &Session, next_page: Option<&str>) -> String {
    let mut out = format!(
        "<h1>Waiting for a decision</h1><p class=\"muted\" data-live>Tenant {}: {} on this page. \
         This list updates by itself.</p>",
        esc(&me.tenant),
        approvals.len()
    );
    if approvals.is_empty() {
        out.push_str("<p class=\"empty\">Nothing is waiting for a decision.</p>");
    }
    out.push_str("<ul class=\"cards\">");
    for a in approvals {
        let _ = write!(
            out,
            "<li class=\"card\" data-approval=\"{id}\"><h2><a href=\"/approvals/{id}\">{tool} \
             <span class=\"muted\">v{version}</span></a></h2>\
             <p><span class=\"risk risk-{risk_class}\">{risk}</span> asked by <strong>{subject}</strong>{agent}</p>\
             <p class=\"why\">{why}</p>\
             <pre class=\"preview\">{preview}</pre>\
             <p class=\"muted\">Run <code>{run}</code>, requested {created}. Expires {expires}</p></li>",
            id = esc(&a.id),
            preview = esc(&preview(&a.arguments_json)),
            run = esc(&a.binding.run_id),
            created = time(a.created_at_ms, false),
            tool = esc(&a.binding.tool),
            version = esc(&a.binding.tool_version),
            risk_class = a.risk_level.as_str().to_ascii_lowercase(),
            risk = a.risk_level.as_str(),
            subject = esc(&a.binding.subject),
            agent = agent(&a.binding.agent),
            why = esc(&a.needed_because),
            expires = time(a.expires_at_ms, true),
        );
    }
    out.push_str("</ul>");
    if let Some(token) = next_page {
        let _ = write!(
            out,
            "<p><a class=\"button\" href=\"/approvals?after={}\">Older requests</a></p>",
            esc(token)
        );
    }
    out
}

/// The start of the arguments, for a list: the approval's page shows them all.
fn preview(json: &str) -> String {
    const MAX: usize = 240;
    match json.len() <= MAX {
        true => json.to_owned(),
        false => format!("{}…", crate::boundary::truncate_utf8(json, MAX)),
    }
}

fn agent(agent: &str) -> String {
    match agent {
        "" => String::new(),
        agent => format!(" through agent <strong>{}</strong>", esc(agent)),
    }
}

/// What a page says after an attempt to decide, besides the approval itself.
pub enum Notice {
    None,
    /// The decision was applied.
    Decided,
    /// It was not: why.
    Refused(String),
}

/// One approval with everything an approver needs, and the decision form when it is pending
/// and someone other than its requester is looking.
pub fn approval(a: &Approval, me: &Session, csrf: &str, notice: &Notice) -> String {
    let mut out = String::with_capacity(a.arguments_json.len() * 2 + 2048);
    match notice {
        Notice::None => {}
        Notice::Decided => {
            let _ = write!(
                out,
                "<p class=\"notice ok\" role=\"status\">You {} this request.</p>",
                match a.state {
                    ApprovalState::Rejected => "rejected",
                    _ => "approved",
                }
            );
        }
        Notice::Refused(why) => {
            let _ = write!(
                out,
                "<p class=\"notice refused\" role=\"alert\">Not decided: {}</p>",
                esc(why)
            );
        }
    }
    let _ = write!(
        out,
        "<h1>{tool} <span class=\"muted\">v{version}</span></h1>\
         <p class=\"state state-{state_class}\" data-state=\"{state_class}\">{state}</p>\
         <dl class=\"facts\">\
         <dt>Risk</dt><dd><span class=\"risk risk-{risk_class}\">{risk}</span></dd>\
         <dt>Why it waits</dt><dd>{why}</dd>\
         <dt>Asked by</dt><dd>{subject}{agent}</dd>\
         <dt>Tenant</dt><dd>{tenant}</dd>\
         <dt>Run</dt><dd><code>{run}</code></dd>\
         <dt>Requested</dt><dd>{created}</dd>\
         <dt>Expires</dt><dd>{expires}</dd>\
         <dt>Approval</dt><dd><code>{id}</code></dd>",
        tool = esc(&a.binding.tool),
        version = esc(&a.binding.tool_version),
        state_class = a.state.as_str(),
        state = state_text(a),
        risk_class = a.risk_level.as_str().to_ascii_lowercase(),
        risk = a.risk_level.as_str(),
        why = esc(&a.needed_because),
        subject = esc(&a.binding.subject),
        agent = agent(&a.binding.agent),
        tenant = esc(&a.binding.tenant),
        run = esc(&a.binding.run_id),
        created = time(a.created_at_ms, false),
        expires = time(a.expires_at_ms, a.state == ApprovalState::Pending),
        id = esc(&a.id),
    );
    if !a.decided_by.is_empty() {
        let _ = write!(
            out,
            "<dt>Decided by</dt><dd>{}{}</dd><dt>Reason</dt><dd>{}</dd>",
            esc(&a.decided_by),
            match a.decided_at_ms {
                0 => String::new(),
                ms => format!(", {}", time(ms, false)),
            },
            match a.reason.as_str() {
                "" => "<span class=\"muted\">none given</span>".to_owned(),
                reason => esc(reason),
            }
        );
    }
    let _ = write!(
        out,
        "</dl><h2>Arguments</h2><p class=\"muted\">Exactly these: a change to any of them needs \
         a new approval. <code>[redacted]</code> marks values the catalog keeps out of records.</p>\
         <pre class=\"arguments\">{}</pre>",
        esc(&pretty(&a.arguments_json))
    );
    if a.state == ApprovalState::Pending {
        if a.binding.subject == me.subject {
            out.push_str(
                "<p class=\"notice\">You asked for this call: someone else must decide it.</p>",
            );
        } else {
            let _ = write!(
                out,
                "<form class=\"decide\" method=\"post\" action=\"/approvals/{id}\">\
                 <input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
                 <label for=\"reason\">Reason <span class=\"muted\">(recorded with your decision; \
                 at most {max} bytes)</span></label>\
                 <textarea id=\"reason\" name=\"reason\" rows=\"3\" maxlength=\"{max}\"></textarea>\
                 <div class=\"buttons\">\
                 <button type=\"submit\" name=\"decision\" value=\"approve\" class=\"approve\">Approve</button>\
                 <button type=\"submit\" name=\"decision\" value=\"reject\" class=\"reject\">Reject</button>\
                 </div></form>",
                id = esc(&a.id),
                csrf = esc(csrf),
                max = crate::approvals::MAX_REASON_BYTES,
            );
        }
    }
    out
}

/// The arguments indented for reading; as stored if they are not JSON.
fn pretty(json: &str) -> String {
    serde_json::from_str::<serde_json::Value>(json)
        .ok()
        .and_then(|value| serde_json::to_string_pretty(&value).ok())
        .unwrap_or_else(|| json.to_owned())
}

fn state_text(a: &Approval) -> String {
    match a.state {
        ApprovalState::Pending => "Waiting for a decision".to_owned(),
        ApprovalState::Approved => format!(
            "Approved by {}: the agent's next call with exactly these arguments runs",
            esc(&a.decided_by)
        ),
        ApprovalState::Rejected => format!("Rejected by {}", esc(&a.decided_by)),
        ApprovalState::Used => format!("Approved by {}, and the call ran", esc(&a.decided_by)),
        ApprovalState::Expired => "Expired before it was used".to_owned(),
        ApprovalState::Invalidated => "No longer valid: the tool's definition changed".to_owned(),
    }
}

/// Recent decisions, a section per state; and the emergency denies in force, when the person
/// may see them.
pub fn decided(sections: &[(&str, Vec<Approval>)], denies: Option<&[EmergencyDeny]>) -> String {
    let mut out = String::from(
        "<h1>Decided</h1><p class=\"muted\">The latest decisions of your tenant, newest first.</p>",
    );
    for (title, approvals) in sections {
        let _ = write!(out, "<h2>{}</h2>", esc(title));
        if approvals.is_empty() {
            out.push_str("<p class=\"empty\">None.</p>");
            continue;
        }
        out.push_str(
            "<div class=\"table\"><table><thead><tr><th scope=\"col\">Tool</th>\
             <th scope=\"col\">Asked by</th><th scope=\"col\">Decided by</th>\
             <th scope=\"col\">When</th><th scope=\"col\">Reason</th></tr></thead><tbody>",
        );
        for a in approvals {
            let _ = write!(
                out,
                "<tr><td><a href=\"/approvals/{}\">{}</a></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&a.id),
                esc(&a.binding.tool),
                esc(&a.binding.subject),
                esc(&a.decided_by),
                match a.decided_at_ms {
                    0 => "—".to_owned(),
                    ms => time(ms, false),
                },
                esc(&a.reason),
            );
        }
        out.push_str("</tbody></table></div>");
    }
    if let Some(denies) = denies {
        out.push_str(
            "<h2>Emergency denies in force</h2><p class=\"muted\">Set and lifted with \
             <code>toolgate deny</code> or the Controls service; shown here, not changed.</p>",
        );
        if denies.is_empty() {
            out.push_str("<p class=\"empty\">None.</p>");
        } else {
            out.push_str(
                "<div class=\"table\"><table class=\"denies\"><thead><tr><th scope=\"col\">Tools</th>\
                 <th scope=\"col\">For</th><th scope=\"col\">Why</th><th scope=\"col\">Set by</th>\
                 <th scope=\"col\">Until</th></tr></thead><tbody>",
            );
            for deny in denies {
                let scope = match (&deny.tenant, &deny.agent) {
                    (None, None) => "every tenant".to_owned(),
                    (Some(t), None) => format!("tenant {t}"),
                    (None, Some(a)) => format!("agent {a}"),
                    (Some(t), Some(a)) => format!("tenant {t}, agent {a}"),
                };
                let _ = write!(
                    out,
                    "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}, {}</td><td>{}</td></tr>",
                    esc(&deny.tools),
                    esc(&scope),
                    esc(&deny.reason),
                    esc(&deny.set_by),
                    time(deny.set_at_ms, false),
                    match deny.expires_at_ms {
                        Some(ms) => time(ms, true),
                        None => "lifted by hand".to_owned(),
                    },
                );
            }
            out.push_str("</tbody></table></div>");
        }
    }
    out
}

/// The sign-in page: why the person is here, and how to sign in.
pub fn sign_in(why: &str, oidc: Option<(&str, &str)>, dev: Option<(&str, &str)>) -> String {
    let mut out = format!("<h1>Sign in</h1><p>{}</p>", esc(why));
    if let Some((issuer, href)) = oidc {
        let _ = write!(
            out,
            "<p><a class=\"button\" href=\"{}\">Sign in with {}</a></p>",
            esc(href),
            esc(issuer)
        );
    }
    if let Some((state, next)) = dev {
        let _ = write!(
            out,
            "<form class=\"dev-sign-in\" method=\"post\" action=\"/sign-in/dev\">\
             <input type=\"hidden\" name=\"state\" value=\"{}\">\
             <input type=\"hidden\" name=\"next\" value=\"{}\">\
             <label for=\"tenant\">Tenant</label><input id=\"tenant\" name=\"tenant\" value=\"acme\" required>\
             <label for=\"subject\">Subject</label><input id=\"subject\" name=\"subject\" value=\"bob\" required>\
             <label for=\"scopes\">Scopes <span class=\"muted\">(space separated)</span></label>\
             <input id=\"scopes\" name=\"scopes\" value=\"toolgate:approve\">\
             <div class=\"buttons\"><button type=\"submit\">Sign in (development)</button></div></form>",
            esc(state),
            esc(next)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_in_values_is_text() {
        assert_eq!(
            esc(r#"<script>alert("x")</script>&'"#),
            "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;&amp;&#39;"
        );
    }
}
