//! Stage 12b: the output guard. A tool's output — and the error text of a backend that failed,
//! which reaches the model too — is screened by the tool's detectors before anything keeps or
//! returns it (the idempotency store, the response, the MCP door's structured content): what a
//! redacting detector finds is replaced with `[REDACTED:<detector>]`; when a blocking one finds
//! anything, the output is withheld and the call ends `ERROR`/`output_blocked`, telling the model
//! that and why, never what. The call's record keeps which detectors fired and how often, never
//! the values.

use super::truncate_utf8;
use crate::{
    catalog::ToolVersion,
    error::{Reason, Refusal, Stage},
    output_guard::{Action, Finding},
};

/// Most bytes of a backend's own error text passed on (to the model, and to records that may
/// carry it), once screened.
pub(super) const MAX_DETAIL_BYTES: usize = 1024;
/// Most bytes of a backend's own error text screened: more than is passed on, so a secret that
/// starts in what is passed on is found whole (a password in a URL whose `@` comes after the
/// cut), and it is cut only after.
pub(super) const MAX_SCREENED_DETAIL_BYTES: usize = 16 * 1024;

/// `result` as the model may see it, and what the detectors found. The chain's stage, and what
/// `toolgate test` applies to a case's sample output. A failed backend's error text is
/// screened first, then cut to what is passed on.
pub fn screen(
    tool: &ToolVersion,
    result: Result<String, Refusal>,
) -> (Result<String, Refusal>, Vec<Finding>) {
    let (result, findings) = screened(tool, result);
    (result.map_err(cut_detail), findings)
}

/// What is passed on of a failed backend's error text, and of its recorded copy: at most
/// [`MAX_DETAIL_BYTES`], and a redaction the cut falls in whole, so the model reads that
/// something was taken out.
fn cut_detail(mut refusal: Refusal) -> Refusal {
    for text in [&mut refusal.detail, &mut refusal.recorded_detail]
        .into_iter()
        .flatten()
    {
        let cut = truncate_utf8(text, MAX_DETAIL_BYTES).len();
        let cut = cut_outside_redactions(text, cut);
        text.truncate(cut);
    }
    refusal
}

/// `cut`, or the end of the redaction it falls in.
fn cut_outside_redactions(text: &str, cut: usize) -> usize {
    if cut >= text.len() {
        return cut;
    }
    // A redaction is `[REDACTED:` and a detector's name of at most 64 bytes, then `]`.
    let mut from = cut.saturating_sub(REDACTED.len() + 64);
    while !text.is_char_boundary(from) {
        from += 1;
    }
    let Some(open) = text[from..]
        .match_indices(REDACTED)
        .map(|(at, _)| from + at)
        .take_while(|&at| at < cut)
        .last()
    else {
        return cut;
    };
    match text[open..].find(']') {
        Some(close) if open + close >= cut => open + close + 1,
        _ => cut,
    }
}

/// How every redaction starts (`[REDACTED:<detector>]`).
const REDACTED: &str = "[REDACTED:";

fn screened(
    tool: &ToolVersion,
    result: Result<String, Refusal>,
) -> (Result<String, Refusal>, Vec<Finding>) {
    let guard = &tool.output_guard;
    if guard.is_off() {
        return (result, Vec::new());
    }
    match result {
        Ok(output) => {
            let screened = guard.screen(&output);
            let findings = screened.findings;
            if screened.blocked {
                let refusal = blocked(&tool.name, "its output was withheld", &findings);
                return (Err(refusal), findings);
            }
            let output = match screened.text {
                std::borrow::Cow::Borrowed(_) => output,
                std::borrow::Cow::Owned(redacted) => redacted,
            };
            (Ok(output), findings)
        }
        Err(mut refusal) => {
            let Some(detail) = refusal.detail.take() else {
                return (Err(refusal), Vec::new());
            };
            let screened = guard.screen(&detail);
            let findings = screened.findings;
            if screened.blocked {
                let message = format!(
                    "{} ({}); its error text was withheld",
                    refusal.message,
                    refusal.reason.code()
                );
                let mut refusal = blocked(&tool.name, &message, &findings);
                refusal.stage = Stage::Execute;
                return (Err(refusal), findings);
            }
            if !findings.is_empty() {
                // What records may carry is made from the screened text as well.
                refusal.recorded_detail = refusal
                    .recorded_detail
                    .take()
                    .map(|recorded| guard.screen(&recorded).text.into_owned());
            }
            refusal.detail = Some(screened.text.into_owned());
            (Err(refusal), findings)
        }
    }
}

/// The refusal of an output a blocking detector found something in: which detectors, and how
/// many matches, never what they matched.
fn blocked(tool: &str, what: &str, findings: &[Finding]) -> Refusal {
    let found = findings
        .iter()
        .filter(|f| f.action == Action::Block)
        .map(|f| {
            let plural = if f.matches == 1 { "" } else { "es" };
            format!("{} ({} match{plural})", f.detector, f.matches)
        })
        .collect::<Vec<_>>()
        .join(", ");
    Refusal::new(
        Stage::Result,
        Reason::OutputBlocked,
        format!(
            "{tool} ran, but {what}: the catalog's output guard blocks what it carried: {found}"
        ),
    )
}
